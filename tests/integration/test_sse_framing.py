"""SSE framing from backends, end to end on real sockets: streams whose lines end in CRLF or CR
(as SSE allows, and as some OpenAI-compatible servers and re-framing gateways send them), and a
backend that never ends its event.

The CRLF and CR streams come from simulated engines through a small gateway that re-frames
their events; the client must get the same whole events as from the engine itself, with
`movable_requests` on and off, streamed and answered whole, and a stream that breaks mid-way
must still continue elsewhere token-exactly.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
import orjson
import pytest
from aiohttp import web

from proxy.settings import load_settings
from simulator.fleet import SimFleet, start_fleet
from tests.integration.test_movable_requests import (
    MODEL,
    PATHS,
    Streamed,
    body_for,
    migrations,
    set_fault,
    stream,
)
from tests.support.fake_backend import FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

LINE_ENDS = {"crlf": b"\r\n", "cr": b"\r"}
_HOP = {"content-length", "transfer-encoding", "connection", "content-encoding"}


@asynccontextmanager
async def reframing_gateway(target: str, line_end: bytes) -> AsyncIterator[str]:
    """An HTTP gateway in front of `target` that rewrites every LF of an event stream as
    `line_end`, splitting its writes inside each line end so that no chunk is aligned."""
    client = httpx.AsyncClient(timeout=60)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        req = client.build_request(
            request.method,
            target + request.path_qs,
            content=body,
            headers={k: v for k, v in request.headers.items() if k.lower() != "host"},
        )
        upstream = await client.send(req, stream=True)
        try:
            headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            resp = web.StreamResponse(status=upstream.status_code, headers=headers)
            await resp.prepare(request)
            sse = upstream.headers.get("content-type", "").startswith("text/event-stream")
            async for chunk in upstream.aiter_raw():
                if not sse:
                    await resp.write(chunk)
                    continue
                # Each CR written on its own: line ends straddle the chunks the proxy reads.
                for i, piece in enumerate(chunk.replace(b"\n", line_end).split(b"\r")):
                    if i:
                        await resp.write(b"\r")
                        await asyncio.sleep(0)
                    if piece:
                        await resp.write(piece)
            await resp.write_eof()
            return resp
        finally:
            await upstream.aclose()

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await client.aclose()


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(3, speed=4.0) as f:
        yield f


@asynccontextmanager
async def framed_backends(f: SimFleet, framing: str) -> AsyncIterator[list[dict[str, str]]]:
    """Engines 0 and 1 behind gateways that frame their streams with `framing`."""
    line_end = LINE_ENDS[framing]
    async with (
        reframing_gateway(f.urls[0], line_end) as g0,
        reframing_gateway(f.urls[1], line_end) as g1,
    ):
        yield [{"url": g0, "id": "e0"}, {"url": g1, "id": "e1"}]


def assert_same_answer(got: Streamed, ref: Streamed) -> None:
    assert got.status == 200 and not got.errors, got.raw[-500:]
    assert got.done == 1
    assert got.text == ref.text and got.text
    assert got.usage == ref.usage


async def test_the_gateway_really_reframes(fleet: SimFleet) -> None:
    async with reframing_gateway(fleet.urls[0], b"\r\n") as g, httpx.AsyncClient() as client:
        path = "/v1/completions"
        r = await client.post(g + path, json=body_for(path, max_tokens=5))
        assert r.status_code == 200
        assert r.content.endswith(b"data: [DONE]\r\n\r\n") and b"\n\n" not in r.content


@pytest.mark.parametrize("framing", list(LINE_ENDS))
@pytest.mark.parametrize("movable", [True, False])
@pytest.mark.parametrize("path", PATHS)
async def test_crlf_and_cr_framed_streams_reach_the_client_whole(
    fleet: SimFleet, framing: str, movable: bool, path: str
) -> None:
    async with framed_backends(fleet, framing) as bs:
        settings = fast_settings(bs, policy="round_robin", movable_requests=movable)
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
            body = body_for(path, max_tokens=40, stream_options={"include_usage": True})
            ref = await stream(client, fleet.urls[2], path, body)
            got = await stream(client, url, path, body)
            assert_same_answer(got, ref)
            # Whole events, re-framed with LF, and no token ids leaking from the tracking.
            assert b"\r" not in got.raw
            assert b"token_ids" not in got.raw


@pytest.mark.parametrize("framing", list(LINE_ENDS))
@pytest.mark.parametrize("path", PATHS)
async def test_a_crlf_framed_stream_still_moves_token_exactly(
    fleet: SimFleet, framing: str, path: str
) -> None:
    async with framed_backends(fleet, framing) as bs:
        settings = fast_settings(bs, policy="round_robin")
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
            body = body_for(
                path, max_tokens=80, return_token_ids=True, stream_options={"include_usage": True}
            )
            ref = await stream(client, fleet.urls[2], path, body)

            async def break_it(s: Streamed) -> None:
                backend = s.headers["x-fleet-backend"]
                await set_fault(client, fleet, backend, cut_stream_after_tokens=12)

            got = await stream(client, url, path, body, after=4, action=break_it)
            assert_same_answer(got, ref)
            assert got.token_ids == ref.token_ids and len(got.token_ids) == 80
            assert (await migrations(client, url)).get(("backend_failed", "ok")) == 1.0


@pytest.mark.parametrize("framing", list(LINE_ENDS))
async def test_a_crlf_framed_stream_is_answered_whole(fleet: SimFleet, framing: str) -> None:
    path = "/v1/chat/completions"
    async with framed_backends(fleet, framing) as bs:
        settings = fast_settings(bs, policy="round_robin", assemble_non_streamed=True)
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
            plain = {k: v for k, v in body_for(path, max_tokens=40).items() if k != "stream"}
            ref = (await client.post(fleet.urls[2] + path, json=plain)).json()
            r = await client.post(url + path, json=plain)
            assert r.status_code == 200, r.text
            got = r.json()
            assert got["choices"][0]["message"] == ref["choices"][0]["message"]
            assert got["usage"] == ref["usage"]


# --- an event that never ends

HUGE = 20 * 1024 * 1024
CAP = 1024 * 1024


@dataclass
class EndlessEventBackend(FakeBackend):
    """A vLLM-shaped backend whose every stream is one event that never ends: `HUGE` bytes of
    data with no blank line, then the end of the response."""

    model: str = MODEL
    streams: int = 0
    finished: int = 0  # streams that got all their bytes out

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.streams += 1
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        piece = b"x" * 65536
        await resp.write(b'data: {"id":"cmpl-huge","choices":[{"index":0,"text":"')
        for _ in range(HUGE // len(piece)):
            await resp.write(piece)
        await resp.write_eof()
        self.finished += 1
        return resp


@asynccontextmanager
async def endless_backend() -> AsyncIterator[EndlessEventBackend]:
    b = EndlessEventBackend()
    await b.start()
    try:
        yield b
    finally:
        await b.stop()


async def test_an_endless_event_ends_a_stream_that_cannot_move_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with endless_backend() as huge:
        settings = fast_settings(
            [{"url": huge.url, "id": "h0"}], movable_requests=False, max_sse_event_bytes=CAP
        )
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
            path = "/v1/completions"
            began = time.monotonic()
            got = await stream(client, url, path, body_for(path, max_tokens=5))
            took = time.monotonic() - began
            assert got.status == 200
            assert len(got.errors) == 1 and got.done == 0 and got.events == got.errors
            error = got.errors[0]["error"]
            assert "incomplete" in error["message"] and error["type"], error
            # The operator's log says why the backend counted as failed.
            assert "over max_sse_event_bytes" in caplog.text
            assert len(got.raw) < CAP  # the partial event never reached the client
            assert took < 10
            # The proxy hung up on the backend rather than reading all of it.
            assert huge.finished == 0


async def test_an_endless_event_moves_a_movable_request_elsewhere() -> None:
    async with endless_backend() as huge, await start_fleet(1, speed=4.0) as good:
        settings = fast_settings(
            [{"url": huge.url, "id": "h0"}, {"url": good.urls[0], "id": "e1"}],
            policy="round_robin",
            max_sse_event_bytes=CAP,
        )
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=30) as client:
            path = "/v1/completions"
            body = body_for(path, max_tokens=20)
            ref = await stream(client, good.urls[0], path, body)
            began = time.monotonic()
            answers = [await stream(client, url, path, body) for _ in range(2)]
            took = time.monotonic() - began
            for got in answers:
                assert got.status == 200 and not got.errors, got.raw[-300:]
                assert got.done == 1 and got.text == ref.text
            assert huge.streams >= 1
            assert took < 20

            def hung_up() -> bool:
                return huge.finished == 0

            await eventually(hung_up, within=5, what="the endless backend's streams cut")


def test_default_cap_fits_a_long_logprobs_event() -> None:
    """A chat event with 20 top logprobs for each of 256 tokens fits the default cap."""
    token = {"token": "x" * 12, "logprob": -1.25, "bytes": list(range(12))}
    top = [dict(token) for _ in range(20)]
    entry = {**token, "top_logprobs": top}
    event = {"choices": [{"index": 0, "logprobs": {"content": [entry] * 256}}]}
    size = len(b"data: " + orjson.dumps(event) + b"\n\n")
    cap = load_settings({"backends": []}).max_sse_event_bytes
    assert size * 4 < cap, (size, cap)
