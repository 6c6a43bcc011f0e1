"""Each fault, as a client sees it over real sockets."""

import asyncio

import aiohttp
import orjson
import pytest

from simulator.fleet import SimFleet
from tests.integration.simulator.conftest import post_json, read_sse
from tests.support.polling import eventually

MODEL = "sim-llama-8b"
LONG = {"model": MODEL, "prompt": "tell me more", "max_tokens": 60, "ignore_eos": True}


async def _healthy(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=2)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


async def test_error_rate_answers_500_with_vllm_shape(fleet: SimFleet, http: aiohttp.ClientSession):
    url = fleet.urls[0]
    status, body = await post_json(http, url + "/_sim/faults", {"error_rate": 1.0})
    assert status == 200 and body["error_rate"] == 1.0
    status, body = await post_json(http, url + "/v1/completions", LONG)
    assert status == 500 and body["error"]["code"] == 500
    assert await _healthy(http, url)
    async with http.delete(url + "/_sim/faults") as r:
        assert (await r.json())["error_rate"] == 0.0
    status, _ = await post_json(http, url + "/v1/completions", LONG)
    assert status == 200


async def test_crash_refuses_connections_until_recovered(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    server = fleet.engines[0]
    await server.crash()
    with pytest.raises(aiohttp.ClientConnectionError):
        await post_json(http, server.url + "/v1/completions", LONG)
    assert await _healthy(http, fleet.urls[1])  # the other engine is untouched
    await server.recover()
    status, _ = await post_json(http, server.url + "/v1/completions", LONG)
    assert status == 200


async def test_crash_by_admin_cuts_streams_and_recovers_by_itself(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    url = fleet.urls[0]
    async with http.post(
        url + "/v1/completions", json={**LONG, "max_tokens": 5000, "stream": True}
    ) as r:
        await r.content.readline()
        status, _ = await post_json(
            http, url + "/_sim/faults", {"crash": True, "recover_after_s": 0.3}
        )
        assert status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await read_sse(r)
    await eventually(lambda: fleet.engines[0].crashed)
    await eventually(lambda: _healthy(http, url))
    assert not fleet.engines[0].engine.core.requests  # a fresh engine


async def test_hang_answers_nothing_until_cleared(fleet: SimFleet, http: aiohttp.ClientSession):
    url = fleet.urls[0]
    await post_json(http, url + "/_sim/faults", {"hang": True})
    pending = asyncio.ensure_future(post_json(http, url + "/v1/completions", LONG))
    with pytest.raises(TimeoutError):
        async with http.get(url + "/health", timeout=aiohttp.ClientTimeout(total=0.3)):
            pass
    assert not pending.done()
    status, body = await post_json(http, url + "/_sim/faults", {"hang": False})
    assert status == 200 and body["hang"] is False
    status, _ = await pending
    assert status == 200


async def test_slowdown_multiplies_step_time(fleet: SimFleet, http: aiohttp.ClientSession):
    normal, slow = fleet.engines
    await post_json(http, slow.url + "/_sim/faults", {"slowdown": 4.0})
    for server in (normal, slow):
        status, _ = await post_json(http, server.url + "/v1/completions", LONG)
        assert status == 200
    assert slow.engine.step_seconds == pytest.approx(4 * normal.engine.step_seconds)


async def test_die_after_tokens_cuts_the_stream_then_refuses(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    url = fleet.urls[0]
    await post_json(http, url + "/_sim/faults", {"die_after_tokens": 5})
    async with http.post(
        url + "/v1/completions", json={**LONG, "stream": True, "return_token_ids": True}
    ) as r:
        tokens: list[int] = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async for raw in r.content:
                if raw.startswith(b"data: {"):
                    tokens.extend(orjson.loads(raw[6:])["choices"][0]["token_ids"])
    assert len(tokens) == 5
    await eventually(lambda: fleet.engines[0].crashed)
    assert not await _healthy(http, url)


async def test_cut_stream_after_tokens_keeps_the_engine_up(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    server = fleet.engines[0]
    await post_json(http, server.url + "/_sim/faults", {"cut_stream_after_tokens": 3})
    async with http.post(
        server.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 50,
            "stream": True,
        },
    ) as r:
        chunks: list[bytes] = []
        with pytest.raises(aiohttp.ClientPayloadError):
            async for raw in r.content:
                if raw.startswith(b"data: "):
                    chunks.append(raw)
    assert len(chunks) == 1 + 3  # the role chunk, then three tokens
    await eventually(lambda: not server.engine.core.requests)
    assert server.engine.core.counters.finished.get("abort") == 1
    assert await _healthy(http, server.url)


async def test_stall_generation_answers_everything_but_generation(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    server = fleet.engines[0]
    url = server.url
    async with http.post(url + "/v1/completions", json={**LONG, "stream": True}) as running:
        assert running.status == 200
        await running.content.readline()  # tokens flow
        status, body = await post_json(http, url + "/_sim/faults", {"stall_generation": True})
        assert status == 200 and body["stall_generation"] is True and body["hang"] is False
        # Whatever was written before the stall drains; then the stream is silent.
        with pytest.raises(TimeoutError):
            while True:
                await asyncio.wait_for(running.content.readline(), 0.3)
        tokens = server.engine.core.counters.generation_tokens
        new_stream = asyncio.ensure_future(
            http.post(url + "/v1/chat/completions", json={
                "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8, "ignore_eos": True, "stream": True,
            })
        )  # fmt: skip
        new_plain = asyncio.ensure_future(post_json(http, url + "/v1/completions", LONG))
        await eventually(lambda: server.in_flight == 3)  # accepted, both waiting
        for path in ("/health", "/metrics", "/v1/models", "/load"):
            async with http.get(url + path, timeout=aiohttp.ClientTimeout(total=2)) as r:
                assert r.status == 200, path
                if path == "/load":
                    assert (await r.json())["server_load"] == 3
        await asyncio.sleep(0.3)
        assert not new_stream.done() and not new_plain.done()  # not even a response head
        assert server.engine.core.counters.generation_tokens == tokens
        async with http.delete(url + "/_sim/faults") as r:
            assert (await r.json())["stall_generation"] is False
        chunks, done = await read_sse(running)
        assert done and chunks
    async with await new_stream as r:
        assert r.status == 200
        chunks, done = await read_sse(r)
        assert done
    status, body = await new_plain
    assert status == 200 and body["usage"]["completion_tokens"] == LONG["max_tokens"]
