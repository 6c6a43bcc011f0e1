"""The official openai SDK through fleet-proxy against real vLLM engines.

Greedy decoding is deterministic, so what comes back through the proxy must equal what the
same engine answers directly: the proxy forwards, it does not rewrite.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.real_vllm.tier import Proxy, Tier

pytestmark = pytest.mark.real_vllm

MAX_TOKENS = 16
# vLLM merges a request's tokens into one output while its API server lags the engine (a
# loaded 2-core machine): 16 tokens can then arrive as one chunk. 64 keep several apart.
STREAMED_TOKENS = 64
GREEDY = 0.0  # temperature
EXTRA = {"ignore_eos": True}  # exact lengths: a random model may otherwise hit EOS early
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are brief."},
    {"role": "user", "content": "Tell me about the river and the mountain."},
]


def sdk(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0)


def direct(tier: Tier, backend_id: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    engine = tier.by_backend_id(backend_id)
    resp = httpx.post(f"{engine.url}{path}", json=body, timeout=120)
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


def test_completion_through_proxy_equals_the_engine_answer(proxy: Proxy, tier: Tier) -> None:
    raw = sdk(proxy).completions.with_raw_response.create(
        model=tier.model,
        prompt="The router sends the request to",
        max_tokens=MAX_TOKENS,
        extra_body=EXTRA,
        temperature=GREEDY,
    )
    completion = raw.parse()
    backend_id = raw.headers["x-fleet-backend"]
    assert backend_id in {e.backend_id for e in tier.engines}
    assert raw.headers["x-request-id"]
    assert completion.model == tier.model
    assert completion.usage is not None
    assert completion.usage.completion_tokens == MAX_TOKENS
    assert completion.choices[0].finish_reason == "length"
    engine_answer = direct(
        tier,
        backend_id,
        "/v1/completions",
        {
            "model": tier.model,
            "prompt": "The router sends the request to",
            "max_tokens": MAX_TOKENS,
            "temperature": GREEDY,
            **EXTRA,
        },
    )
    assert completion.choices[0].text == engine_answer["choices"][0]["text"]
    assert completion.choices[0].text.strip()


def test_chat_through_proxy_equals_the_engine_answer(proxy: Proxy, tier: Tier) -> None:
    raw = sdk(proxy).chat.completions.with_raw_response.create(
        model=tier.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=EXTRA,
        temperature=GREEDY,
    )
    chat = raw.parse()
    assert chat.usage is not None and chat.usage.completion_tokens == MAX_TOKENS
    assert chat.choices[0].message.role == "assistant"
    engine_answer = direct(
        tier,
        raw.headers["x-fleet-backend"],
        "/v1/chat/completions",
        {
            "model": tier.model,
            "messages": MESSAGES,
            "max_tokens": MAX_TOKENS,
            "temperature": GREEDY,
            **EXTRA,
        },
    )
    assert chat.choices[0].message.content == engine_answer["choices"][0]["message"]["content"]


def test_streamed_completion_with_usage(proxy: Proxy, tier: Tier) -> None:
    client = sdk(proxy)
    prompt = "Write a story about the quiet city"
    raw = client.completions.with_raw_response.create(
        model=tier.model,
        prompt=prompt,
        max_tokens=STREAMED_TOKENS,
        extra_body=EXTRA,
        temperature=GREEDY,
    )
    whole = raw.parse()
    with client.completions.with_streaming_response.create(
        model=tier.model,
        prompt=prompt,
        max_tokens=STREAMED_TOKENS,
        extra_body=EXTRA,
        temperature=GREEDY,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        pieces, usage, chunks = [], None, 0
        for chunk in response.parse():
            chunks += 1
            if chunk.choices:
                pieces.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage
        streamed_by = response.headers["x-fleet-backend"]
    assert chunks > 2, "a stream of one chunk would not show streaming"
    assert "".join(pieces) == whole.choices[0].text, (
        f"streamed by {streamed_by}: {pieces!r}; "
        f"whole by {raw.headers['x-fleet-backend']}: {whole.choices[0].text!r}"
    )
    assert usage is not None, "stream_options.include_usage must yield a usage chunk"
    assert usage.completion_tokens == STREAMED_TOKENS
    assert whole.usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens


def test_streamed_chat_with_usage(proxy: Proxy, tier: Tier) -> None:
    client = sdk(proxy)
    whole = client.chat.completions.create(
        model=tier.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=EXTRA,
        temperature=GREEDY,
    )
    stream = client.chat.completions.create(
        model=tier.model,
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        extra_body=EXTRA,
        temperature=GREEDY,
        stream=True,
        stream_options={"include_usage": True},
    )
    pieces, usage, roles = [], None, set()
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            pieces.append(delta.content or "")
            if delta.role:
                roles.add(delta.role)
        if chunk.usage is not None:
            usage = chunk.usage
    assert roles == {"assistant"}
    assert "".join(pieces) == whole.choices[0].message.content
    assert usage is not None and usage.completion_tokens == MAX_TOKENS
    assert whole.usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
