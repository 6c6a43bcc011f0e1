"""Continuation, the base of live migration: prompt + the first k greedy tokens, sent as token
ids to the OTHER engine, yields exactly the remaining tokens of the uninterrupted run."""

from __future__ import annotations

import random
from typing import Any

import httpx
import pytest

from tests.real_vllm.tier import Proxy, Tier

pytestmark = pytest.mark.real_vllm

TOTAL = 40
GREEDY = {"temperature": 0.0, "ignore_eos": True, "return_token_ids": True}


def post(proxy: Proxy, path: str, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
    r = httpx.post(f"{proxy.url}{path}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    data: dict[str, Any] = r.json()
    return data, r.headers["x-fleet-backend"]


def continue_elsewhere(
    proxy: Proxy, tier: Tier, origin: str, prompt_ids: list[int], generated: list[int], k: int
) -> list[int]:
    """Send prompt + generated[:k] through the proxy until it lands on another engine than
    `origin` (round_robin alternates, so at most one extra request)."""
    body = {
        "model": tier.model,
        "prompt": prompt_ids + generated[:k],
        "max_tokens": TOTAL - k,
        **GREEDY,
    }
    for _ in range(len(tier.engines) + 1):
        data, backend = post(proxy, "/v1/completions", body)
        if backend != origin:
            ids: list[int] = data["choices"][0]["token_ids"]
            return ids
    raise AssertionError(f"the proxy never routed away from {origin}")


def test_completion_continues_exactly_on_the_other_engine(proxy: Proxy, tier: Tier) -> None:
    prompt = [random.Random(11).randrange(16, 2000) for _ in range(50)]
    data, origin = post(
        proxy,
        "/v1/completions",
        {"model": tier.model, "prompt": prompt, "max_tokens": TOTAL, **GREEDY},
    )
    generated = data["choices"][0]["token_ids"]
    assert len(generated) == TOTAL
    # A model that repeats one token would make the comparison below trivially true.
    assert len(set(generated)) > TOTAL // 2, generated
    for k in (1, 8, 25):
        assert continue_elsewhere(proxy, tier, origin, prompt, generated, k) == generated[k:], k


def test_chat_continues_exactly_as_token_ids_on_the_other_engine(proxy: Proxy, tier: Tier) -> None:
    messages = [{"role": "user", "content": "Tell me about the morning light on the stone road."}]
    data, origin = post(
        proxy,
        "/v1/chat/completions",
        {"model": tier.model, "messages": messages, "max_tokens": TOTAL, **GREEDY},
    )
    prompt_ids = data["prompt_token_ids"]  # the chat template applied by the engine
    generated = data["choices"][0]["token_ids"]
    assert len(generated) == TOTAL and len(set(generated)) > TOTAL // 2
    for k in (1, 8, 25):
        assert continue_elsewhere(proxy, tier, origin, prompt_ids, generated, k) == generated[k:], k
