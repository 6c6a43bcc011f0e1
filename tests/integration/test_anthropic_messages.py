"""Anthropic's Messages API through the proxy to simulated vLLM engines, spoken by the official
`anthropic` SDK: whole and streamed answers, count_tokens, x-api-key, the Anthropic error
shape, retries before the first byte, a cut stream's error event, and prefix-aware routing."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import orjson
import pytest
from aiohttp import web

from proxy.request.anthropic_errors import MAX_ERROR_BYTES
from simulator.fleet import SimFleet, start_fleet
from tests.support.fake_backend import FakeBackend, Seen
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
HI = [{"role": "user", "content": "Say hello to the fleet"}]


@pytest.fixture
async def fleet() -> AsyncIterator[SimFleet]:
    async with await start_fleet(2, speed=10.0) as f:
        yield f


def client(url: str, key: str = "x") -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, timeout=30)


def events(body: bytes) -> list[tuple[str, dict[str, Any]]]:
    """An Anthropic stream's events: (event name, data), in order."""
    out = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], orjson.loads(lines["data"])))
    return out


async def test_the_sdk_gets_whole_and_streamed_messages_and_counts_tokens(
    fleet: SimFleet,
) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _):
        c = client(url)
        whole = await c.messages.create(
            model=MODEL, max_tokens=8, system="You are terse.", messages=HI
        )
        assert whole.type == "message" and whole.role == "assistant"
        assert whole.stop_reason == "max_tokens"
        assert whole.usage.output_tokens == 8 and whole.usage.input_tokens > 0
        text = whole.content[0].text  # type: ignore[union-attr]
        assert text
        async with c.messages.stream(
            model=MODEL, max_tokens=8, system="You are terse.", messages=HI
        ) as stream:
            streamed = "".join([t async for t in stream.text_stream])
            final = await stream.get_final_message()
        # Deterministic engines: the same request gives the same text on either backend.
        assert streamed == text
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8
        counted = await c.messages.count_tokens(model=MODEL, system="You are terse.", messages=HI)  # type: ignore[arg-type]
        assert counted.input_tokens == whole.usage.input_tokens
        await c.close()
        async with httpx.AsyncClient() as h:
            metrics = (await h.get(url + "/metrics")).text
        for endpoint in ("messages", "messages/count_tokens"):
            assert f'endpoint="{endpoint}"' in metrics, endpoint


async def test_a_stream_is_relayed_event_by_event_in_vllms_order(fleet: SimFleet) -> None:
    body = {"model": MODEL, "max_tokens": 4, "messages": HI, "stream": True}
    async with running_proxy(fast_settings(fleet.urls)) as (url, _), httpx.AsyncClient() as h:
        r = await h.post(url + "/v1/messages", json=body)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        names = [name for name, _ in events(r.content)]
        assert names[:3] == ["message_start", "content_block_start", "content_block_delta"]
        assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        for name, data in events(r.content):
            assert data["type"] == name


async def test_x_api_key_is_accepted_as_a_bearer_key_is_and_a_wrong_one_refused(
    fleet: SimFleet,
) -> None:
    settings = fast_settings(fleet.urls, api_keys=["k-good"])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient() as h:
        good = client(url, "k-good")
        answer = await good.messages.create(model=MODEL, max_tokens=2, messages=HI)
        assert answer.usage.output_tokens == 2
        await good.close()
        bad = client(url, "k-bad")
        with pytest.raises(anthropic.AuthenticationError) as refused:
            await bad.messages.create(model=MODEL, max_tokens=2, messages=HI)
        assert refused.value.status_code == 401
        assert refused.value.body == {
            "type": "error",
            "error": {"type": "authentication_error", "message": "incorrect API key provided"},
        }
        await bad.close()
        # Every route reads x-api-key: the OpenAI ones and the control plane's /v1/models.
        models = await h.get(url + "/v1/models", headers={"x-api-key": "k-good"})
        assert models.status_code == 200
        chat = await h.post(
            url + "/v1/chat/completions",
            headers={"x-api-key": "k-good"},
            json={"model": MODEL, "messages": HI, "max_tokens": 2},
        )
        assert chat.status_code == 200
        assert (await h.get(url + "/v1/models", headers={"x-api-key": "k-bad"})).status_code == 401
        # The Bearer key still works, on the Messages route too.
        sdk = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k-good", max_retries=0)
        assert (await sdk.models.list()).data
        await sdk.close()
        r = await h.post(
            url + "/v1/messages/count_tokens",
            headers={"authorization": "Bearer k-good"},
            json={"model": MODEL, "messages": HI},
        )
        assert r.status_code == 200 and r.json()["input_tokens"] > 0
        missing = await h.post(url + "/v1/messages", json={"model": MODEL})
        assert missing.status_code == 401
        assert missing.json()["error"]["type"] == "authentication_error"
        assert "x-api-key" in missing.json()["error"]["message"]


def anthropic_error(r: httpx.Response, status: int, kind: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert set(body["error"]) == {"type", "message"}
    message: str = body["error"]["message"]
    return message


async def test_errors_on_the_messages_routes_are_in_anthropics_shape(fleet: SimFleet) -> None:
    async with running_proxy(fast_settings(fleet.urls)) as (url, _), httpx.AsyncClient() as h:
        for path in ("/v1/messages", "/v1/messages/count_tokens"):
            r = await h.post(url + path, content=b"{not json")
            assert "not valid JSON" in anthropic_error(r, 400, "invalid_request_error")
            r = await h.post(url + path, json={"messages": HI, "max_tokens": 2})
            assert "model" in anthropic_error(r, 400, "invalid_request_error")
            r = await h.post(url + path, json={"model": MODEL, "max_tokens": 2})
            assert "messages" in anthropic_error(r, 400, "invalid_request_error")
            r = await h.post(url + path, json={"model": "no-such", "messages": HI, "max_tokens": 2})
            assert "no-such" in anthropic_error(r, 404, "not_found_error")
            r = await h.get(url + path)
            anthropic_error(r, 405, "invalid_request_error")
        # The engine's own refusal (vLLM's, its OpenAI error type in Anthropic's envelope)
        # keeps its message and gets the Anthropic type of its status.
        r = await h.post(url + "/v1/messages", json={"model": MODEL, "messages": HI})
        assert "max_tokens" in anthropic_error(r, 400, "invalid_request_error")
        # The SDK reads them as its own errors.
        c = client(url)
        with pytest.raises(anthropic.NotFoundError) as unknown:
            await c.messages.create(model="no-such", max_tokens=2, messages=HI)
        assert unknown.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
        await c.close()
        # The OpenAI routes keep the OpenAI shape.
        r = await h.post(url + "/v1/chat/completions", json={"model": "no-such", "messages": HI})
        assert r.status_code == 404 and "type" not in r.json() and r.json()["error"]["message"]


async def test_no_backend_to_serve_is_an_overloaded_error() -> None:
    body = {"model": MODEL, "messages": HI, "max_tokens": 2}
    async with (
        await start_fleet(1, speed=10.0) as fleet,
        running_proxy(fast_settings(fleet.urls)) as (url, _),
        httpx.AsyncClient() as h,
    ):
        await fleet.engines[0].crash()

        async def refused() -> bool:
            return (await h.post(url + "/v1/messages", json=body)).status_code == 503

        await eventually(refused, what="the crashed engine found down")
        r = await h.post(url + "/v1/messages", json=body)
        assert "no healthy backend" in anthropic_error(r, 503, "overloaded_error")
        assert r.headers["retry-after"] == "1"


async def test_a_dead_engine_before_the_first_byte_is_retried_on_another(
    fleet: SimFleet,
) -> None:
    # Health checks too rare to notice the crash: the requests themselves find it.
    settings = fast_settings(fleet.urls, policy="round_robin", health_interval=30.0)
    async with running_proxy(settings) as (url, _):
        dead, alive = fleet.engines
        await dead.crash()
        c = client(url)
        for stream in (False, True, False, True):
            raw = await c.messages.with_raw_response.create(
                model=MODEL, max_tokens=4, messages=HI, stream=stream
            )
            assert raw.headers["x-fleet-backend"] == alive.url.removeprefix("http://")
            if stream:
                names = [e.type async for e in await raw.parse()]  # type: ignore[union-attr]
                assert names[-1] == "message_stop"
            else:
                assert (await raw.parse()).usage.output_tokens == 4  # type: ignore[union-attr]
        await c.close()
        async with httpx.AsyncClient() as h:
            metrics = (await h.get(url + "/metrics")).text
        dead_id = dead.url.removeprefix("http://")
        assert f'fleet_proxy_upstream_errors_total{{backend="{dead_id}",kind="connect"}}' in metrics


async def test_a_stream_cut_mid_way_ends_with_an_anthropic_error_event(fleet: SimFleet) -> None:
    for engine in fleet.engines:
        engine.faults.apply({"cut_stream_after_tokens": 3})
    body = {"model": MODEL, "max_tokens": 20, "messages": HI, "stream": True}
    async with running_proxy(fast_settings(fleet.urls)) as (url, _), httpx.AsyncClient() as h:
        r = await h.post(url + "/v1/messages", json=body)
        assert r.status_code == 200
        got = events(r.content)
        assert got[0][0] == "message_start"
        assert "content_block_delta" in [name for name, _ in got]
        name, data = got[-1]
        assert name == "error"
        assert data["type"] == "error" and data["error"]["type"] == "api_error"
        assert "incomplete" in data["error"]["message"]
        # The SDK raises it as an error, after the text that came.
        c = client(url)
        texts: list[str] = []
        with pytest.raises(anthropic.APIStatusError) as cut:
            async with c.messages.stream(model=MODEL, max_tokens=20, messages=HI) as stream:
                async for text in stream.text_stream:
                    texts.append(text)
        assert texts and "incomplete" in str(cut.value)
        await c.close()


async def test_prefix_aware_routing_keeps_a_conversation_on_its_engine() -> None:
    async with (
        await start_fleet(4, speed=20.0) as fleet,
        running_proxy(fast_settings(fleet.urls, policy="prefix_aware")) as (url, _),
    ):
        c = client(url)
        homes: dict[int, set[str]] = {}
        for turn in range(4):
            for conversation in range(3):
                # The conversations differ in their system prompt only: it is routing text too.
                system = f"Conversation {conversation}: you route requests. " * 40
                messages: list[dict[str, Any]] = []
                for t in range(turn + 1):
                    messages.append({"role": "user", "content": f"Turn {t}: " + "detail " * 40})
                    messages.append({"role": "assistant", "content": f"Answer {t}."})
                raw = await c.messages.with_raw_response.create(
                    model=MODEL,
                    max_tokens=2,
                    system=[{"type": "text", "text": system}],
                    messages=messages[:-1],  # type: ignore[arg-type]
                )
                homes.setdefault(conversation, set()).add(raw.headers["x-fleet-backend"])
        await c.close()
        assert all(len(h) == 1 for h in homes.values()), homes


@dataclass
class MessagesEngine(FakeBackend):
    """An engine whose Messages streams end cleanly (the response complete) after `ending`:
    "stop", message_stop as vLLM ends them; "error", its own error event (vLLM's when it
    fails mid-stream); "nothing", no last event at all."""

    ending: str = "stop"
    refusal: bytes = b""  # when set, every request is answered 422 with this plain text

    def _routes(self, app: web.Application) -> None:
        super()._routes(app)
        app.router.add_post("/v1/messages", self._messages)

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.seen.append(Seen(request.path, headers, await request.json()))
        if self.refusal:
            return web.Response(status=422, body=self.refusal, content_type="text/plain")
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        start = {"type": "message_start", "message": {"id": "m", "content": [], "model": "x"}}
        delta = {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "hi"}}
        await resp.write(sse_event("message_start", start))
        await resp.write(sse_event("content_block_delta", {**delta, "index": 0}))
        if self.ending == "stop":
            await resp.write(sse_event("message_stop", {"type": "message_stop"}))
        elif self.ending == "error":
            error = {"type": "error", "error": {"type": "internal_error", "message": "boom"}}
            await resp.write(sse_event("error", error))
        await resp.write_eof()
        return resp


def sse_event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {orjson.dumps(data).decode()}\n\n".encode()


@pytest.mark.parametrize(
    ("ending", "last"),
    [("stop", "message_stop"), ("error", "error"), ("nothing", "error")],
)
async def test_a_stream_that_ends_before_its_last_event_gets_an_error_event(
    ending: str, last: str
) -> None:
    engine = MessagesEngine(ending=ending)
    await engine.start()
    try:
        body = {"model": engine.model, "max_tokens": 4, "messages": HI, "stream": True}
        async with (
            running_proxy(fast_settings([engine.url])) as (url, _),
            httpx.AsyncClient() as h,
        ):
            r = await h.post(url + "/v1/messages", json=body)
        got = events(r.content)
        assert [name for name, _ in got] == ["message_start", "content_block_delta", last]
        if ending == "nothing":  # the proxy's own: the engine's is relayed as it is
            assert got[-1][1]["error"]["type"] == "api_error"
    finally:
        await engine.stop()


async def test_the_clients_key_stays_on_its_hop() -> None:
    engine = MessagesEngine()
    await engine.start()
    try:
        body = {"model": engine.model, "max_tokens": 4, "messages": HI, "stream": True}
        settings = fast_settings([engine.url], api_keys=["k-good"])
        async with running_proxy(settings) as (url, _), httpx.AsyncClient() as h:
            headers = {"x-api-key": "k-good", "anthropic-version": "2023-06-01"}
            r = await h.post(url + "/v1/messages", json=body, headers=headers)
        assert r.status_code == 200
        [seen] = engine.seen
        assert "x-api-key" not in seen.headers and "authorization" not in seen.headers
        assert seen.headers["anthropic-version"] == "2023-06-01"  # the rest goes on
    finally:
        await engine.stop()


@pytest.mark.parametrize("size", [100, 3 << 20])
async def test_an_engines_error_answer_is_reshaped_unless_too_long_to_hold(size: int) -> None:
    refusal = b"x" * size
    engine = MessagesEngine(refusal=refusal)
    await engine.start()
    try:
        body = {"model": engine.model, "max_tokens": 4, "messages": HI}
        async with running_proxy(fast_settings([engine.url])) as (url, _), httpx.AsyncClient() as h:
            r = await h.post(url + "/v1/messages", json=body)
        if size <= MAX_ERROR_BYTES:
            assert anthropic_error(r, 422, "invalid_request_error") == refusal.decode()
        else:  # relayed as it came, not held whole
            assert r.status_code == 422 and r.content == refusal
    finally:
        await engine.stop()


async def test_counting_tokens_teaches_the_prefix_index_nothing() -> None:
    system = "A long shared system prompt for routing. " * 40
    async with (
        await start_fleet(2, speed=20.0) as fleet,
        running_proxy(fast_settings(fleet.urls, policy="prefix_aware")) as (url, app),
    ):
        c = client(url)
        for _ in range(3):
            await c.messages.count_tokens(model=MODEL, system=system, messages=HI)
        index = app.core.policy.services.prefix_index  # type: ignore[attr-defined]
        assert index is None or index.size() == 0
        await c.messages.create(model=MODEL, max_tokens=2, system=system, messages=HI)
        index = app.core.policy.services.prefix_index  # type: ignore[attr-defined]
        assert index is not None and index.size() > 0  # a generation request is remembered
        await c.close()
