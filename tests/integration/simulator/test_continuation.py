"""Resubmitting prompt + the first k generated tokens to another engine continues exactly:
the property live migration and failover rely on."""

import aiohttp
import pytest

from simulator.fleet import SimFleet
from tests.integration.simulator.conftest import post_json, read_sse

MODEL = "sim-llama-8b"
N = 40


@pytest.mark.parametrize("k", [1, 8, 25])
async def test_completion_continues_on_another_engine(
    fleet: SimFleet, http: aiohttp.ClientSession, k: int
):
    a, b = fleet.urls
    _, full = await post_json(
        http,
        a + "/v1/completions",
        {
            "model": MODEL,
            "prompt": "Once upon a time in a quiet village",
            "max_tokens": N,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    choice = full["choices"][0]
    prompt_ids, out = choice["prompt_token_ids"], choice["token_ids"]
    assert len(out) == N
    _, rest = await post_json(
        http,
        b + "/v1/completions",
        {
            "model": MODEL,
            "prompt": prompt_ids + out[:k],
            "max_tokens": N - k,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert rest["choices"][0]["token_ids"] == out[k:]


@pytest.mark.parametrize("k", [1, 8, 25])
async def test_chat_continues_as_token_id_completion(
    fleet: SimFleet, http: aiohttp.ClientSession, k: int
):
    a, b = fleet.urls
    _, chat = await post_json(
        http,
        a + "/v1/chat/completions",
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Name three rivers."},
            ],
            "max_tokens": N,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    out = chat["choices"][0]["token_ids"]
    _, rest = await post_json(
        http,
        b + "/v1/completions",
        {
            "model": MODEL,
            "prompt": chat["prompt_token_ids"] + out[:k],
            "max_tokens": N - k,
            "ignore_eos": True,
            "return_token_ids": True,
        },
    )
    assert rest["choices"][0]["token_ids"] == out[k:]


async def test_streamed_token_ids_match_and_eos_ends_naturally(
    fleet: SimFleet, http: aiohttp.ClientSession
):
    """The token ids a stream carries, chunk by chunk, are those another engine returns in
    one response: a stream can be continued from what the client has already seen."""
    a, b = fleet.urls
    body = {
        "model": MODEL,
        "prompt": "Counting sheep",
        "max_tokens": 2000,
        "return_token_ids": True,
    }
    async with http.post(a + "/v1/completions", json={**body, "stream": True}) as resp:
        assert resp.status == 200
        chunks, done = await read_sse(resp)
    assert done
    streamed = [i for c in chunks for ch in c["choices"] for i in ch.get("token_ids") or ()]
    finish = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert len(chunks) > 2  # it really streamed: more than one event carried tokens
    _, whole = await post_json(http, b + "/v1/completions", body)
    choice = whole["choices"][0]
    assert streamed == choice["token_ids"]
    # Without ignore_eos the deterministic model ends by EOS well before max_tokens.
    assert finish == ["stop"] and choice["finish_reason"] == "stop"
    assert len(streamed) < 2000
