"""Large non-streamed answers on real sockets: relayed as they come past `hold_answer_bytes`,
byte-exact, closed short when the backend breaks mid-way; and the answers the proxy must hold
whole (assembled from a stream, a backend's 400 to wrap) capped by `max_held_answer_bytes`."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web

from tests.support.fake_backend import FakeBackend, Seen
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MIB = 1024 * 1024
SIZE = 20 * MIB
PIECE = 64 * 1024
GATE_AT = 4 * MIB  # the backend waits here until the test has seen the first bytes arrive
TOKENS = 7


def large_body(size: int) -> bytes:
    """A completions answer of exactly `size` bytes, its usage at the end."""
    head = b'{"id":"cmpl-large","object":"text_completion","model":"fake-model","choices":'
    head += b'[{"index":0,"finish_reason":"length","text":"'
    usage = b'"}],"usage":{"prompt_tokens":3,"completion_tokens":%d,"total_tokens":%d}}' % (
        TOKENS,
        3 + TOKENS,
    )
    filler = size - len(head) - len(usage)
    text = (b"0123456789abcdef" * (filler // 16 + 1))[:filler]
    return head + text + usage


@dataclass
class LargeAnswerBackend(FakeBackend):
    """Answers non-streamed requests with `body`, PIECE bytes at a time; with `gate`, it stops
    at GATE_AT until the gate is set; with `break_at`, it drops the connection there;
    `chunked`: without a Content-Length."""

    body: bytes = b""
    chunked: bool = False
    break_at: int | None = None
    gate: asyncio.Event | None = None
    sent: int = 0
    finished: bool = False

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.seen.append(Seen(request.path, dict(request.headers), payload))
        resp = web.StreamResponse(headers={"content-type": "application/json"})
        if not self.chunked:
            resp.content_length = len(self.body)
        await resp.prepare(request)
        for start in range(0, len(self.body), PIECE):
            if self.break_at is not None and start >= self.break_at:
                assert request.transport is not None
                request.transport.abort()
                return resp
            if self.gate is not None and start == GATE_AT:
                await self.gate.wait()
            await resp.write(self.body[start : start + PIECE])
            self.sent = start + PIECE
        await resp.write_eof()
        self.finished = True
        return resp


@dataclass
class EndlessErrorBackend(FakeBackend):
    """Answers every generation request 500 with a body that never ends."""

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        self.seen.append(Seen(request.path, dict(request.headers), await request.json()))
        resp = web.StreamResponse(status=500, headers={"content-type": "text/plain"})
        await resp.prepare(request)
        while True:  # ends when the proxy closes the connection (the handler is cancelled)
            await resp.write(b"overloaded " * 6000)
            await asyncio.sleep(0.01)


@pytest.fixture
async def large() -> Any:
    b = LargeAnswerBackend(body=large_body(SIZE))
    await b.start()
    yield b
    await b.stop()


REQUEST = {"model": "fake-model", "prompt": "hello", "max_tokens": TOKENS}


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
async def test_a_large_answer_reaches_the_client_before_the_backend_finished_it(
    large: LargeAnswerBackend, chunked: bool, tmp_path: Path
) -> None:
    large.chunked = chunked
    large.gate = asyncio.Event()
    log_file = tmp_path / "requests.jsonl"
    config = fast_settings([large.url], request_log="json", request_log_file=log_file)
    async with (
        running_proxy(config) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
        c.stream("POST", "/v1/completions", json=REQUEST) as r,
    ):
        assert r.status_code == 200
        assert r.headers["content-type"] == "application/json"
        if chunked:
            assert "content-length" not in r.headers
        else:
            assert r.headers["content-length"] == str(SIZE)
        got = bytearray()
        chunks = r.aiter_raw()

        async def first_bytes() -> None:
            while len(got) < MIB:
                got.extend(await anext(chunks))

        # The backend is held at GATE_AT: only a proxy that relays can hand these over now.
        await asyncio.wait_for(first_bytes(), timeout=20)
        assert not large.finished
        large.gate.set()
        async for chunk in chunks:
            got.extend(chunk)
        assert bytes(got) == large.body
        assert large.finished

        def logged() -> dict[str, Any] | None:
            lines = log_file.read_bytes().splitlines() if log_file.exists() else []
            return orjson.loads(lines[0]) if lines else None

        # The request log reads the usage from the end the proxy kept.
        line = await eventually(logged, what="the request's log line")
        assert line["status"] == 200
        assert line["completion_tokens"] == TOKENS
        labels = {"endpoint": "completions", "model": "fake-model", "status": "200"}
        assert app.core.prom.get_sample_value("fleet_proxy_requests_total", labels) == 1


@pytest.mark.parametrize("chunked", [False, True], ids=["content_length", "chunked"])
async def test_a_backend_breaking_mid_relay_closes_the_client_short(
    large: LargeAnswerBackend, chunked: bool, caplog: pytest.LogCaptureFixture
) -> None:
    large.chunked = chunked
    large.break_at = 3 * MIB
    caplog.set_level(logging.WARNING, logger="fleet_proxy.session")
    config = fast_settings([large.url])
    async with (
        running_proxy(config) as (url, app),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        got = bytearray()
        with pytest.raises(httpx.RemoteProtocolError):
            async with c.stream("POST", "/v1/completions", json=REQUEST) as r:
                assert r.status_code == 200
                async for chunk in r.aiter_raw():
                    got.extend(chunk)
        # Never a false complete answer: what came is a true prefix, and short.
        assert 0 < len(got) < SIZE
        assert large.body.startswith(bytes(got))
        assert len(large.seen) == 1  # not tried again: part of it had reached the client

        def counted() -> float | None:
            labels = {"endpoint": "completions", "model": "fake-model", "status": "502"}
            return app.core.prom.get_sample_value("fleet_proxy_requests_total", labels)

        assert await eventually(counted, what="the request counted as 502") == 1
        failure = {"backend": large.url.removeprefix("http://"), "kind": "mid_stream"}
        errors = app.core.prom.get_sample_value("fleet_proxy_upstream_errors_total", failure)
        assert errors == 1
        assert "connection is closed short" in caplog.text


async def test_a_small_answer_broken_while_read_is_still_tried_again(
    large: LargeAnswerBackend,
) -> None:
    """Below `hold_answer_bytes` the answer is read whole first, so a break is retried."""
    large.break_at = 3 * MIB
    config = fast_settings([large.url], hold_answer_bytes=SIZE, max_attempts=2)
    async with (
        running_proxy(config) as (url, _),
        httpx.AsyncClient(base_url=url, timeout=60) as c,
    ):
        r = await c.post("/v1/completions", json=REQUEST)
        assert r.status_code == 502
        assert r.json()["error"]["type"] == "upstream_error"
        assert len(large.seen) == 2


async def test_an_assembled_answer_over_the_cap_fails_cleanly(backend: FakeBackend) -> None:
    backend.behaviour.chunks = 400  # ~40 KB of events
    config = fast_settings(
        [backend.url], assemble_non_streamed=True, max_held_answer_bytes=8 * 1024
    )
    async with running_proxy(config) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json=REQUEST)
        assert r.status_code == 502
        error = r.json()["error"]
        assert error["type"] == "upstream_error"
        assert "8192-byte cap (max_held_answer_bytes)" in error["message"]
        assert backend.seen[0].body["stream"] is True  # it was being assembled
        assert len(backend.seen) == 1  # another backend would send the same answer

        backend.behaviour.chunks = 20  # under the cap: assembled as before
        r = await c.post("/v1/completions", json=REQUEST)
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == "".join(f"t{i} " for i in range(20))


async def test_a_backend_400_over_the_cap_fails_cleanly(backend: FakeBackend) -> None:
    backend.behaviour.fail_status = 400
    backend.behaviour.fail_text = "x" * (4 * MIB)  # more than one socket read brings
    config = fast_settings([backend.url], max_held_answer_bytes=8 * 1024)
    async with running_proxy(config) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json=REQUEST)
        assert r.status_code == 502
        error = r.json()["error"]
        assert "400 answer is over the 8192-byte cap (max_held_answer_bytes)" in error["message"]

        backend.behaviour.fail_text = "bad request"  # under it: wrapped as before
        r = await c.post("/v1/completions", json=REQUEST)
        assert r.status_code == 400
        assert "(bad request)" in json.loads(r.content)["error"]["message"]


async def test_a_large_json_answer_to_a_streamed_request_is_not_cut_by_a_move(
    large: LargeAnswerBackend,
) -> None:
    """A backend may answer "stream": true with JSON: relayed as it comes, it has no token to
    cut after, so a planned move is refused rather than cutting the answer short."""
    other = LargeAnswerBackend(body=large.body)
    await other.start()
    large.gate = other.gate = asyncio.Event()
    config = fast_settings([large.url, other.url], policy="round_robin")
    try:
        async with (
            running_proxy(config) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=60) as c,
            c.stream("POST", "/v1/completions", json={**REQUEST, "stream": True}) as r,
        ):
            assert r.status_code == 200
            chunks = r.aiter_raw()
            got = bytearray(await asyncio.wait_for(anext(chunks), timeout=20))
            rid = r.headers["x-request-id"]
            moved = await c.post(f"/admin/requests/{rid}/migrate", json={})
            assert moved.status_code == 409
            assert moved.json()["detail"] == "not_streaming"
            live = (await c.get("/admin/requests")).json()
            [view] = [v for v in live if v["request_id"] == rid]
            assert view["not_movable_reason"] == "not_streaming"
            large.gate.set()
            async for chunk in chunks:
                got.extend(chunk)
            assert bytes(got) == large.body
    finally:
        await other.stop()


async def test_a_500_whose_body_never_ends_is_tried_again_at_once(backend: FakeBackend) -> None:
    """Only the start of an error body is read, for its detail: the request goes on to another
    backend without waiting for (or holding) the rest."""
    endless = EndlessErrorBackend()
    await endless.start()
    config = fast_settings([endless.url, backend.url], policy="round_robin", error_details=True)
    try:
        async with running_proxy(config) as (url, app), httpx.AsyncClient(base_url=url) as c:
            for _ in range(2):  # round robin: the endless backend is asked first at least once
                r = await asyncio.wait_for(c.post("/v1/completions", json=REQUEST), timeout=20)
                assert r.status_code == 200
            assert endless.seen
            failure = {"backend": endless.url.removeprefix("http://"), "kind": "status"}
            errors = app.core.prom.get_sample_value("fleet_proxy_upstream_errors_total", failure)
            assert errors == len(endless.seen)
            assert endless.behaviour.healthy  # only its answer failed
    finally:
        await endless.stop()
