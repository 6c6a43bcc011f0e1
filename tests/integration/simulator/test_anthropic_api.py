"""Anthropic's Messages API of one simulated engine, over real sockets, in vLLM's shapes."""

from __future__ import annotations

import aiohttp
import orjson

from simulator.fleet import SimFleet
from tests.integration.simulator.conftest import post_json

MODEL = "sim-llama-8b"
HI = [{"role": "user", "content": "Hello there"}]


async def test_a_message_is_the_chat_answer_in_anthropics_shape(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    url = fleet.urls[0]
    body = {"model": MODEL, "max_tokens": 6, "system": "Be terse.", "messages": HI}
    status, message = await post_json(http, url + "/v1/messages", body)
    assert status == 200
    assert message.keys() == {"id", "type", "role", "content", "model", "stop_reason", "usage"}
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["id"].startswith("chatcmpl-") and message["model"] == MODEL
    assert message["stop_reason"] == "max_tokens"
    [block] = message["content"]
    assert block["type"] == "text" and block["text"]
    # The same request as chat: the same prompt, the same text.
    chat = {
        "model": MODEL,
        "max_tokens": 6,
        "messages": [{"role": "system", "content": "Be terse."}, *HI],
    }
    _, answer = await post_json(http, url + "/v1/chat/completions", chat)
    assert block["text"] == answer["choices"][0]["message"]["content"]
    assert message["usage"] == {
        "input_tokens": answer["usage"]["prompt_tokens"],
        "output_tokens": 6,
    }
    status, counted = await post_json(
        http,
        url + "/v1/messages/count_tokens",
        {"model": MODEL, "system": "Be terse.", "messages": HI},
    )
    n = answer["usage"]["prompt_tokens"]
    assert status == 200
    assert counted == {"input_tokens": n, "context_management": {"original_input_tokens": n}}


async def test_a_streamed_message_has_vllms_events(
    fleet: SimFleet, http: aiohttp.ClientSession
) -> None:
    body = {"model": MODEL, "max_tokens": 5, "messages": HI, "stream": True}
    async with http.post(fleet.urls[0] + "/v1/messages", json=body) as r:
        assert r.status == 200
        raw = await r.read()
    events = []
    for block in raw.decode().split("\n\n")[:-1]:
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        events.append((name[7:], orjson.loads(data[6:])))
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[1] == "content_block_start"
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert all(d["type"] == n for n, d in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"]["output_tokens"] == 0
    assert events[1][1] == {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    deltas = [d["delta"] for n, d in events if n == "content_block_delta"]
    assert all(d["type"] == "text_delta" and d["text"] for d in deltas)
    end = events[-2][1]
    assert end["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert end["usage"] == {"input_tokens": start["usage"]["input_tokens"], "output_tokens": 5}


async def test_errors_are_vllms(fleet: SimFleet, http: aiohttp.ClientSession) -> None:
    url = fleet.urls[0] + "/v1/messages"
    status, body = await post_json(http, url, {"model": "nope", "max_tokens": 2, "messages": HI})
    assert status == 404
    assert body["type"] == "error" and body["error"]["type"] == "NotFoundError"
    assert "nope" in body["error"]["message"]
    # A missing field fails vLLM's validation, which answers in OpenAI's shape.
    status, body = await post_json(http, url, {"model": MODEL, "messages": HI})
    assert status == 400 and "type" not in body
    assert body["error"]["type"] == "Bad Request" and body["error"]["param"] == "body.max_tokens"
    assert "'msg': 'Field required'" in body["error"]["message"]
