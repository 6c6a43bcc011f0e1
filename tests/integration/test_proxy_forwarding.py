"""The proxy on a real socket in front of fake vLLM backends on real sockets."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support.fake_backend import Behaviour, FakeBackend
from tests.support.polling import eventually
from tests.support.servers import fast_settings, running_proxy
from tests.support.sockets import unanswering_listener


@pytest.fixture
async def two_backends() -> AsyncIterator[list[FakeBackend]]:
    backends = [FakeBackend(), FakeBackend()]
    for b in backends:
        await b.start()
    yield backends
    for b in backends:
        await b.stop()


async def test_completion_passes_body_untouched_and_tags_response(two_backends):
    settings = fast_settings([b.url for b in two_backends], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {
            "model": "fake-model",
            "prompt": "hello",
            "max_tokens": 4,
            "ignore_eos": True,
            "kv_transfer_params": {"do_remote_decode": False},
            "return_token_ids": True,
        }
        r = await c.post("/v1/completions", json=body, headers={"x-request-id": "abc-1"})
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"].startswith("t0")
        assert r.headers["x-request-id"] == "abc-1"
        chosen = r.headers["x-fleet-backend"]
        served = [b for b in two_backends if b.url.endswith(chosen)]
        assert len(served) == 1
        seen = served[0].seen[-1]
        assert seen.body == body
        # The client's id, kept as a prefix, made unique for the engine.
        assert re.fullmatch(r"abc-1-[0-9a-f]{12}", seen.headers["x-request-id"])


async def test_a_repeated_single_valued_header_reaches_the_backend_once(two_backends):
    """Backends on aiohttp (or behind a gateway that checks) refuse a request repeating
    content-type or user-agent: the proxy sends the value it read itself, the last."""
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        headers = [
            ("content-type", "text/plain"),
            ("user-agent", "a"),
            ("content-type", "application/json"),
            ("user-agent", "b"),
        ]
        body = b'{"model": "fake-model", "prompt": "x"}'
        r = await c.post("/v1/completions", content=body, headers=headers)
        assert r.status_code == 200, r.text
        seen = next(b.seen[-1] for b in two_backends if b.seen)
        assert seen.headers["content-type"] == "application/json"
        assert seen.headers["user-agent"] == "b"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        # The proxy parsed the body as plain JSON: told it was gzip, an aiohttp backend fails
        # decoding it (a 5xx, retried, then the client's 502).
        ("content-encoding", "gzip"),
        # The client's expectation was settled with the proxy; one a backend does not know
        # would be answered 417 (not an OpenAI error).
        ("expect", "something-else"),
    ],
)
async def test_client_headers_about_the_body_sent_to_the_proxy_are_not_sent_on(
    two_backends, name, value
):
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = b'{"model": "fake-model", "prompt": "x"}'
        r = await c.post(
            "/v1/completions",
            content=body,
            headers={"content-type": "application/json", name: value},
        )
        assert r.status_code == 200, r.text
        seen = next(b.seen[-1] for b in two_backends if b.seen)
        assert name not in seen.headers


async def test_a_backend_url_with_a_path_prefix_keeps_it():
    """A backend behind a path-routing gateway: scrapes and forwarded requests keep its prefix."""
    gated = FakeBackend(prefix="/pool-a/vllm")
    await gated.start()
    try:
        settings = fast_settings([gated.url])
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            assert r.status_code == 200
            assert r.json()["choices"][0]["text"].startswith("t0")
            r = await c.post("/tokenize", json={"model": "fake-model", "prompt": "abc"})
            assert r.json()["path"] == "/pool-a/vllm/tokenize"
    finally:
        await gated.stop()


async def test_round_robin_spreads_and_models_are_listed(two_backends):
    settings = fast_settings([b.url for b in two_backends], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        used = set()
        for _ in range(4):
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            used.add(r.headers["x-fleet-backend"])
        assert len(used) == 2
        models = (await c.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["fake-model"]


async def test_streaming_relays_every_event_in_order(two_backends):
    for b in two_backends:
        b.behaviour = Behaviour(chunks=64)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {
            "model": "fake-model",
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        events = []
        async with c.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
        assert events[-1] == "[DONE]"
        contents = [json.loads(e)["choices"][0]["delta"]["content"] for e in events[:64]]
        assert contents == [f"t{i} " for i in range(64)]
        assert json.loads(events[64])["usage"]["completion_tokens"] == 64


async def test_streaming_chunks_arrive_before_the_stream_ends(two_backends):
    """Relayed as they come: the first event is read while the backend is still generating."""
    # A minute between events: a proxy that buffered the stream would deliver nothing within
    # the bound below, and the backend is surely still mid-request when the first one comes.
    for b in two_backends:
        b.behaviour = Behaviour(chunks=5, chunk_delay=60.0)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {"model": "fake-model", "prompt": "x", "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.aiter_lines()
            async with asyncio.timeout(20):
                first = await anext(lines)
            assert first.startswith("data: ")
            # The backend has produced one event and is sleeping: it is still mid-request.
            assert sum(b.active for b in two_backends) == 1


async def test_client_disconnect_cancels_upstream_request(two_backends):
    for b in two_backends:
        b.behaviour = Behaviour(chunks=100, chunk_delay=0.05)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, app):
        async with httpx.AsyncClient(base_url=url) as c:
            body = {"model": "fake-model", "prompt": "x", "stream": True}
            async with c.stream("POST", "/v1/completions", json=body) as r:
                lines = r.aiter_lines()
                await anext(lines)
                assert sum(b.active for b in two_backends) == 1
        # Leaving the block closed the connection mid-stream.
        await eventually(
            lambda: sum(b.active for b in two_backends) == 0, what="no request at a backend"
        )
        assert sum(b.cancelled for b in two_backends) == 1
        assert len(app.core.live) == 0
        assert all(b.load.in_flight == 0 for b in app.core.fleet)


async def test_client_leaving_a_slow_non_streamed_request_aborts_it(two_backends):
    """A client that sends its request and leaves at once: the backend still sees the
    request cancelled, although the proxy only starts watching the client after a while."""
    for b in two_backends:
        b.behaviour = Behaviour(first_byte_delay=5.0)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, app):
        host, port = url.removeprefix("http://").split(":")
        body = b'{"model": "fake-model", "prompt": "x"}'
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        await eventually(
            lambda: sum(b.active for b in two_backends) == 1, what="the request at a backend"
        )
        writer.close()
        await eventually(
            lambda: sum(b.cancelled for b in two_backends) == 1,
            what="the backend's request cancelled",
        )
        assert sum(b.active for b in two_backends) == 0
        assert all(b.load.in_flight == 0 for b in app.core.fleet)


async def test_5xx_before_first_byte_is_retried_on_another_backend(two_backends):
    bad, good = two_backends
    bad.behaviour = Behaviour(fail_status=503)
    settings = fast_settings([bad.url, good.url], policy="round_robin")
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for _ in range(4):
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            assert r.status_code == 200
            assert good.url.endswith(r.headers["x-fleet-backend"])
        metrics = (await c.get("/metrics")).text
        assert 'fleet_proxy_retries_total{reason="status"}' in metrics


async def test_connect_error_is_retried_and_backend_marked_down(two_backends):
    dead, good = two_backends
    settings = fast_settings([dead.url, good.url], policy="round_robin")
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        await dead.stop()
        for _ in range(3):
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            assert r.status_code == 200
            assert good.url.endswith(r.headers["x-fleet-backend"])
        backend = app.core.fleet.get(dead.url.split("//")[1])
        assert backend is not None and not backend.healthy


async def test_a_lone_backend_that_failed_once_is_tried_again():
    """With nothing else to try, the retry goes back to the same (still healthy) backend."""
    only = FakeBackend(behaviour=Behaviour(fail_status=503, fail_times=1))
    await only.start()
    try:
        settings = fast_settings([only.url])
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
            r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
            assert r.status_code == 200
            assert len(only.seen) == 2
    finally:
        await only.stop()


async def test_connect_timeout_is_retried_on_another_backend(two_backends):
    good = two_backends[0]
    with unanswering_listener() as silent:
        # Slow scrapes: the test sets the silent backend's state and nothing overrides it.
        settings = fast_settings(
            [silent, good.url],
            policy="round_robin",
            connect_timeout=0.3,
            max_attempts=2,
            scrape_interval=30.0,
            health_interval=30.0,
            stale_after=60.0,
        )
        async with running_proxy(settings) as (url, app):
            fleet = list(app.core.fleet)
            known = next(b for b in fleet if good.url.endswith(b.id))
            stuck = next(b for b in fleet if b is not known)
            # As an engine that answered its scrapes, then stopped accepting connections.
            stuck.spec = dataclasses.replace(stuck.spec, models=known.spec.models)
            stuck.snapshot = known.snapshot
            stuck.healthy = True
            async with httpx.AsyncClient(base_url=url) as c:
                for _ in range(4):
                    r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
                    assert r.status_code == 200
                    assert r.headers["x-fleet-backend"] == known.id
                metrics = (await c.get("/metrics")).text
    assert f'fleet_proxy_upstream_errors_total{{backend="{stuck.id}",kind="connect_timeout"}}' in (
        metrics
    )
    # Slow to accept is not down: unlike a refused connection, it keeps its health.
    assert stuck.healthy


async def test_all_backends_failing_gives_502_naming_them(two_backends):
    for b in two_backends:
        b.behaviour = Behaviour(fail_status=500)
    # Not stopped after two backends failing in a row: the whole attempt budget is used.
    settings = fast_settings([b.url for b in two_backends], max_backends_failed_in_a_row=0)
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 502
        err = r.json()["error"]
        # Both backends, then one of them again: every attempt of the budget (3) was used.
        assert "3 attempt(s)" in err["message"]
        assert sum(len(b.seen) for b in two_backends) == 3
        assert err["type"] == "upstream_error"


async def test_backend_4xx_is_relayed_not_retried(two_backends):
    for b in two_backends:
        b.behaviour = Behaviour(fail_status=400)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json={"model": "fake-model", "prompt": "x"})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == "injected"
        assert sum(len(b.seen) for b in two_backends) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_backends_plain_text_400_reaches_the_client_in_the_openai_shape(
    two_backends, stream
):
    """An engine that refuses a request before its API layer (an oversized header, say)
    answers plain text; an OpenAI client reads `error.message`."""
    for b in two_backends:
        b.behaviour = Behaviour(fail_status=400, fail_text="Bad Request: header too large")
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {"model": "fake-model", "prompt": "x", "stream": stream}
        r = await c.post("/v1/completions", json=body)
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/json"
        backend = r.headers["x-fleet-backend"]
        assert r.json()["error"] == {
            "message": f"backend {backend} refused the request to /v1/completions: it "
            "answered 400 (Bad Request: header too large)",
            "type": "invalid_request_error",
            "param": None,
            "code": 400,
        }
        assert sum(len(b.seen) for b in two_backends) == 1  # a refusal is not retried


async def test_headers_over_the_forwarding_budget_get_a_431_before_any_backend(two_backends):
    big = {"x-trace-context": "t" * 10_000}  # under the front door's 64 KiB, over 8 KiB
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {"model": "fake-model", "prompt": "x"}
        r = await c.post("/v1/completions", json=body, headers=big)
        assert r.status_code == 431
        error = r.json()["error"]
        assert "max_forwarded_header_bytes" in error["message"] and error["code"] == 431
        assert sum(len(b.seen) for b in two_backends) == 0
        assert (await c.post("/v1/completions", json=body)).status_code == 200
        # Under the budget a large header goes on as it came.
        medium = {"x-trace-context": "m" * 4_000}
        assert (await c.post("/v1/completions", json=body, headers=medium)).status_code == 200
        traced = [s.headers.get("x-trace-context") for b in two_backends for s in b.seen]
        assert [v for v in traced if v is not None] == [medium["x-trace-context"]]
    lowered = fast_settings([b.url for b in two_backends], max_forwarded_header_bytes=2048)
    async with running_proxy(lowered) as (url, _), httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/completions", json=body, headers=medium)
        assert r.status_code == 431


async def test_death_mid_stream_ends_with_error_event_and_no_duplicates(two_backends):
    for b in two_backends:
        b.behaviour = Behaviour(chunks=10, die_after_chunks=3)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        body = {"model": "fake-model", "prompt": "x", "stream": True}
        async with c.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200
            events = [ln[6:] async for ln in r.aiter_lines() if ln.startswith("data: ")]
        texts = [json.loads(e)["choices"][0]["text"] for e in events[:-1]]
        assert texts == ["t0 ", "t1 ", "t2 "]
        assert json.loads(events[-1])["error"]["type"] == "upstream_error"
        assert sum(len(b.seen) for b in two_backends) == 1  # not retried after the first byte


async def test_forwarded_by_model_endpoints(two_backends):
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, _), httpx.AsyncClient(base_url=url) as c:
        for path in ("/v1/embeddings", "/tokenize", "/detokenize"):
            r = await c.post(path, json={"model": "fake-model", "prompt": "abc"})
            assert r.status_code == 200
            assert r.json()["path"] == path


async def test_accounting_counts_in_flight_and_pending_prefill(two_backends):
    for b in two_backends:
        b.behaviour = Behaviour(chunks=3, first_byte_delay=0.5)
    settings = fast_settings([b.url for b in two_backends])
    async with running_proxy(settings) as (url, app), httpx.AsyncClient(base_url=url) as c:
        prompt = "x" * 400  # 100 tokens at 4 chars per token
        task = asyncio.create_task(
            c.post("/v1/completions", json={"model": "fake-model", "prompt": prompt})
        )
        await eventually(
            lambda: any(b.load.in_flight for b in app.core.fleet), what="a request in flight"
        )
        loads = [b.load for b in app.core.fleet]
        assert sum(ld.in_flight for ld in loads) == 1
        assert sum(ld.pending_prefill_tokens for ld in loads) == 100
        live = list(app.core.live)
        assert len(live) == 1 and live[0].view()["charged_prompt_tokens"] == 100
        r = await task
        assert r.status_code == 200
        assert all(ld.in_flight == 0 and ld.pending_prefill_tokens == 0 for ld in loads)
