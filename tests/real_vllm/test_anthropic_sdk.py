"""The official anthropic SDK through fleet-proxy against real vLLM engines' Messages API.

Greedy decoding is deterministic, so the text that comes back through the proxy, whole or
streamed, must equal what the same engine answers directly: the proxy relays, it does not
rewrite.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam

from tests.real_vllm.tier import Proxy, Tier

pytestmark = pytest.mark.real_vllm

MAX_TOKENS = 16
# Greedy decoding; this SDK has no `temperature` argument, vLLM reads the field.
GREEDY = {"temperature": 0}
SYSTEM = "You are brief."
MESSAGES: list[MessageParam] = [
    {"role": "user", "content": "Tell me about the river and the mountain."}
]


def sdk(proxy: Proxy) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=120)


def text_of(blocks: list[Any]) -> str:
    return "".join(b.text for b in blocks if b.type == "text")


def test_a_message_through_the_proxy_equals_the_engine_answer(proxy: Proxy, tier: Tier) -> None:
    raw = sdk(proxy).messages.with_raw_response.create(
        model=tier.model, max_tokens=MAX_TOKENS, system=SYSTEM, messages=MESSAGES, extra_body=GREEDY
    )
    message = raw.parse()
    backend_id = raw.headers["x-fleet-backend"]
    assert backend_id in {e.backend_id for e in tier.engines}
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert 0 < message.usage.output_tokens <= MAX_TOKENS and message.usage.input_tokens > 0
    engine = tier.by_backend_id(backend_id)
    direct = httpx.post(
        f"{engine.url}/v1/messages",
        json={
            "model": tier.model,
            "max_tokens": MAX_TOKENS,
            "system": SYSTEM,
            "messages": MESSAGES,
            **GREEDY,
        },
        timeout=120,
    )
    direct.raise_for_status()
    assert text_of(message.content) == "".join(
        b["text"] for b in direct.json()["content"] if b["type"] == "text"
    )


def test_a_streamed_message_has_the_whole_answers_text(proxy: Proxy, tier: Tier) -> None:
    client = sdk(proxy)
    whole = client.messages.create(
        model=tier.model, max_tokens=MAX_TOKENS, system=SYSTEM, messages=MESSAGES, extra_body=GREEDY
    )
    names: list[str] = []
    with client.messages.stream(
        model=tier.model, max_tokens=MAX_TOKENS, system=SYSTEM, messages=MESSAGES, extra_body=GREEDY
    ) as stream:
        for event in stream:
            names.append(event.type)
        final = stream.get_final_message()
    assert names[0] == "message_start" and names[-1] == "message_stop"
    assert "content_block_delta" in names, "a stream of no delta would not show streaming"
    assert text_of(final.content) == text_of(whole.content)
    assert final.usage.output_tokens == whole.usage.output_tokens
    counted = client.messages.count_tokens(model=tier.model, system=SYSTEM, messages=MESSAGES)
    assert counted.input_tokens == whole.usage.input_tokens


def test_the_engines_refusal_reaches_the_client_in_anthropics_shape(
    proxy: Proxy, tier: Tier
) -> None:
    # vLLM answers a request failing its validation in OpenAI's error shape.
    r = httpx.post(
        f"{proxy.url}/v1/messages", json={"model": tier.model, "messages": MESSAGES}, timeout=60
    )
    assert r.status_code == 400
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
