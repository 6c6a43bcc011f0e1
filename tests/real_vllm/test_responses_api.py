"""The Responses API with the official openai SDK through fleet-proxy against real vLLM engines.

The proxy keeps the stored responses itself and asks the engine to keep nothing, so a thread
continues on whichever engine the routing policy picks. Greedy decoding is deterministic and
both engines run the same weights, so what an engine answers through the proxy must equal
what it answers directly to the same (expanded) input.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import openai
import pytest

from tests.real_vllm.tier import Proxy, Tier

pytestmark = pytest.mark.real_vllm

MAX_OUTPUT_TOKENS = 16  # vLLM's minimum for a response is 1; 16 keeps the tiny model quick
GREEDY = 0.0  # temperature
FIRST = "Tell me about the river and the mountain."
SECOND = "And what about the quiet city beyond them?"
# The proxy's own ids: vLLM's are `resp_` and 16 hex digits.
PROXY_ID = re.compile(r"resp_[0-9a-f]{32}")


def sdk(proxy: Proxy) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120)


def direct(tier: Tier, backend_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """The engine's own answer to a Responses request, stored nowhere."""
    engine = tier.by_backend_id(backend_id)
    resp = httpx.post(
        f"{engine.url}/v1/responses",
        json={
            "model": tier.model,
            "max_output_tokens": MAX_OUTPUT_TOKENS,
            "temperature": GREEDY,
            "store": False,
            **body,
        },
        timeout=120,
    )
    resp.raise_for_status()
    data: dict[str, Any] = resp.json()
    return data


def text_of(answer: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in answer["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def test_a_response_through_the_proxy_equals_the_engine_answer(proxy: Proxy, tier: Tier) -> None:
    client = sdk(proxy)
    raw = client.responses.with_raw_response.create(
        model=tier.model, input=FIRST, max_output_tokens=MAX_OUTPUT_TOKENS, temperature=GREEDY
    )
    response = raw.parse()
    backend_id = raw.headers["x-fleet-backend"]
    assert backend_id in {e.backend_id for e in tier.engines}
    assert PROXY_ID.fullmatch(response.id), f"not the proxy's id: {response.id}"
    assert response.model == tier.model
    # 16 tokens of a random model: vLLM stops it at the limit ("incomplete").
    assert response.status in ("completed", "incomplete")
    assert response.usage is not None
    assert 0 < response.usage.output_tokens <= MAX_OUTPUT_TOKENS
    assert response.output_text.strip()
    engine_answer = direct(tier, backend_id, {"input": FIRST})
    assert response.output_text == text_of(engine_answer)
    assert response.usage.input_tokens == engine_answer["usage"]["input_tokens"]
    # Stored by the proxy (the engine was told to keep nothing).
    stored = client.responses.retrieve(response.id)
    assert stored.id == response.id and stored.output_text == response.output_text


def test_a_streamed_response_has_the_whole_answers_text(proxy: Proxy, tier: Tier) -> None:
    client = sdk(proxy)
    whole = client.responses.create(
        model=tier.model, input=FIRST, max_output_tokens=MAX_OUTPUT_TOKENS, temperature=GREEDY
    )
    names: list[str] = []
    deltas: list[str] = []
    final: Any = None
    stream = client.responses.create(
        model=tier.model,
        input=FIRST,
        max_output_tokens=MAX_OUTPUT_TOKENS,
        temperature=GREEDY,
        stream=True,
    )
    for event in stream:
        names.append(event.type)
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert names[0] == "response.created", names
    assert names[-1] in ("response.completed", "response.incomplete"), names
    # At least one delta, not several: vLLM merges a request's outputs while its API server
    # lags the engine (a loaded 2-core machine), and a Responses request cannot ignore EOS, so
    # a short answer can come as one delta. The proxy relays vLLM's events as they come.
    assert deltas, f"a stream without a delta: {names}"
    assert "".join(deltas) == whole.output_text
    assert final is not None and PROXY_ID.fullmatch(final.id)
    assert final.id != whole.id
    assert final.output_text == whole.output_text
    # Stored before its last event reached the client.
    assert client.responses.retrieve(final.id).output_text == whole.output_text


def test_a_thread_continues_on_the_other_engine(proxy: Proxy, tier: Tier) -> None:
    """round_robin sends consecutive requests to alternate engines: the second turn lands on
    the engine that never saw the first, which vLLM alone could not continue."""
    client = sdk(proxy)
    raw_first = client.responses.with_raw_response.create(
        model=tier.model, input=FIRST, max_output_tokens=MAX_OUTPUT_TOKENS, temperature=GREEDY
    )
    first = raw_first.parse()
    raw_then = client.responses.with_raw_response.create(
        model=tier.model,
        input=SECOND,
        previous_response_id=first.id,
        max_output_tokens=MAX_OUTPUT_TOKENS,
        temperature=GREEDY,
    )
    then = raw_then.parse()
    first_by, then_by = raw_first.headers["x-fleet-backend"], raw_then.headers["x-fleet-backend"]
    assert first_by != then_by, f"both turns on {first_by}: the test proves nothing"
    assert PROXY_ID.fullmatch(then.id) and then.previous_response_id == first.id
    assert then.output_text.strip()
    assert first.usage is not None and then.usage is not None
    # The second engine received the whole thread: the first turn's input and answer before
    # the new input...
    assert then.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens, (
        then.usage,
        first.usage,
    )
    # ...exactly as a client that sends the thread itself would have it.
    thread = [
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": SECOND},
    ]
    engine_answer = direct(tier, then_by, {"input": thread})
    assert then.output_text == text_of(engine_answer)
    assert then.usage.input_tokens == engine_answer["usage"]["input_tokens"]
