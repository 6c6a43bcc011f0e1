"""The OpenAI API of one simulated engine, over real sockets."""

import aiohttp
import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from simulator.fleet import SimFleet
from tests.integration.simulator.conftest import post_json, read_sse
from tests.support.polling import eventually

MODEL = "sim-llama-8b"


async def test_completion_with_token_ids_and_usage(fleet: SimFleet, http: aiohttp.ClientSession):
    status, body = await post_json(
        http,
        fleet.urls[0] + "/v1/completions",
        {
            "model": MODEL,
            "prompt": "The capital of France is",
            "max_tokens": 12,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert status == 200
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 12
    assert body["usage"] == {
        "prompt_tokens": len(choice["prompt_token_ids"]),
        "completion_tokens": 12,
        "total_tokens": len(choice["prompt_token_ids"]) + 12,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    status, detok = await post_json(
        http, fleet.urls[0] + "/detokenize", {"tokens": choice["token_ids"]}
    )
    assert detok["prompt"] == choice["text"]


async def test_streamed_chat_equals_unstreamed_and_ends_with_usage(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": 20,
        "ignore_eos": True,
    }
    status, full = await post_json(http, fleet.urls[0] + "/v1/chat/completions", body)
    assert status == 200 and full["object"] == "chat.completion"
    async with http.post(
        fleet.urls[1] + "/v1/chat/completions",
        json={**body, "stream": True, "stream_options": {"include_usage": True}},
    ) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        chunks, done = await read_sse(r)
    assert done
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == full["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"] == []
    usage = {k: v for k, v in full["usage"].items() if not k.endswith("_details")}
    assert chunks[-1]["usage"] == usage
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


async def test_stream_flushes_early_and_disconnect_frees_blocks(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    server = fleet.engines[0]
    core = server.engine.core
    resp = await http.post(
        server.url + "/v1/completions",
        json={
            "model": MODEL,
            "prompt": "word " * 200,
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        },
    )
    got = 0
    async for raw in resp.content:
        if raw.startswith(b"data: "):
            got += 1
            if got == 3:
                break
    # Three chunks arrived while the request is still generating: chunks are not buffered.
    assert len(core.running) == 1 and core.pool.usage() > 0
    resp.close()
    await eventually(lambda: not server.engine.core.running)
    assert core.pool.usage() == 0.0
    assert core.counters.finished.get("abort") == 1


async def test_a_chat_stream_opens_only_once_the_prompt_is_prefilled(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    # vLLM sends the assistant-role chunk with the engine's first output: a router that counts
    # a prompt as pending until the first bytes must not see it end before the engine's
    # prefill does (a 4,000-token prompt takes ~30 ms of wall time at speed 4).
    server = fleet.engines[0]
    core = server.engine.core
    resp = await http.post(
        server.url + "/v1/chat/completions",
        json={
            "model": MODEL,
            "messages": [{"role": "user", "content": "word " * 4000}],
            "max_tokens": 2000,
            "ignore_eos": True,
            "stream": True,
        },
    )
    async for raw in resp.content:
        if raw.startswith(b"data: "):
            assert orjson.loads(raw[6:])["choices"][0]["delta"]["role"] == "assistant"
            break
    (req,) = core.running
    assert req.output_ids, "the stream opened before the prompt's first token"
    resp.close()
    await eventually(lambda: not server.engine.core.running)


async def test_a_request_id_of_any_header_bytes_is_taken(fleet: SimFleet):
    """Header values may hold bytes past ASCII that are not UTF-8; vLLM takes them as latin-1."""
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
    async with httpx.AsyncClient(base_url=fleet.urls[0]) as c:
        for stream in (False, True):
            r = await c.post(
                "/v1/completions",
                json={**body, "stream": stream},
                headers=[(b"x-request-id", b"req-\x80\xff")],
            )
            assert r.status_code == 200, r.text
            first = r.json() if not stream else orjson.loads(r.text.split("\n")[0][6:])
            assert first["id"] == "cmpl-req-\x80\xff"


async def test_abort_endpoint_ends_the_stream(fleet: SimFleet, http: aiohttp.ClientSession):
    url = fleet.urls[0]
    async with http.post(
        url + "/v1/completions",
        headers={"X-Request-Id": "req-77"},
        json={
            "model": MODEL,
            "prompt": "hello",
            "max_tokens": 5000,
            "ignore_eos": True,
            "stream": True,
        },
    ) as r:
        await r.content.readline()
        status, body = await post_json(
            http, url + "/inference/v1/abort_requests", {"request_ids": ["req-77"]}
        )
        assert status == 200 and body["aborted"] == ["req-77"]
        chunks, done = await read_sse(r)
    assert done and chunks[-1]["choices"][0]["finish_reason"] == "abort"
    assert fleet.engines[0].engine.core.pool.usage() == 0.0


async def test_side_endpoints(fleet: SimFleet, http: aiohttp.ClientSession):
    url = fleet.urls[0]
    async with http.get(url + "/health") as r:
        assert r.status == 200
    async with http.get(url + "/v1/models") as r:
        models = await r.json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] > 0
    async with http.get(url + "/version") as r:
        assert (await r.json())["version"].startswith("0.32")
    async with http.get(url + "/load") as r:
        assert await r.json() == {"server_load": 0}
    status, tok = await post_json(http, url + "/tokenize", {"prompt": "hello world"})
    assert status == 200 and tok["count"] == len(tok["tokens"]) and tok["tokens"][0] == 1
    status, chat_tok = await post_json(
        http, url + "/tokenize", {"messages": [{"role": "user", "content": "hello world"}]}
    )
    assert status == 200 and chat_tok["count"] > tok["count"]


async def test_errors_are_shaped_like_vllm(fleet: SimFleet, http: aiohttp.ClientSession):
    url = fleet.urls[0] + "/v1/completions"
    status, body = await post_json(http, url, {"model": "nope", "prompt": "x"})
    assert status == 404 and body["error"]["code"] == 404
    status, body = await post_json(http, url, {"model": MODEL, "prompt": "x " * 200_000})
    assert status == 400 and "maximum context length" in body["error"]["message"]
    async with http.post(url, data=b"{not json") as r:
        assert r.status == 400


async def test_metrics_follow_traffic(fleet: SimFleet, http: aiohttp.ClientSession):
    url = fleet.urls[1]
    prompt = "shared system prompt " * 40
    for _ in range(2):
        status, _ = await post_json(
            http,
            url + "/v1/completions",
            {"model": MODEL, "prompt": prompt, "max_tokens": 4, "ignore_eos": True},
        )
        assert status == 200
    async with http.get(url + "/metrics") as r:
        page = await r.text()
    values = {
        s.name: s.value
        for f in text_string_to_metric_families(page)
        for s in f.samples
        if not s.labels.get("le")
    }
    assert values["vllm:generation_tokens_total"] == 8
    assert values["vllm:prefix_cache_hits_total"] > 0  # the second request reused the first's
    assert values["vllm:time_to_first_token_seconds_count"] == 2
    assert values["vllm:num_requests_running"] == 0
