"""Requests sharing a long prefix raise prefix_cache_hits on the engine that holds it."""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable

import httpx
import pytest

from policies.registry import policy_names
from tests.real_vllm.tier import Proxy, Tier, cache_config, engine_metric

pytestmark = pytest.mark.real_vllm

REQUESTS = 4  # over 2 engines: at least one engine gets the prefix at least twice


def long_prefix(tier: Tier, min_tokens: int) -> tuple[str, int]:
    """Text unique to this run (so no earlier run left it cached), ending in a newline so the
    prefix tokenizes the same whatever follows it; returns it with its token count."""
    rng = random.Random(uuid.uuid4().int)
    words = [uuid.uuid4().hex]
    engine = tier.engines[0]
    while True:
        words += [f"w{rng.randrange(5000)}" for _ in range(100)]
        text = " ".join(words) + "\n"
        tokens = httpx.post(
            f"{engine.url}/tokenize", timeout=30, json={"model": tier.model, "prompt": text}
        ).json()["count"]
        if tokens >= min_tokens:
            return text, int(tokens)


@pytest.mark.parametrize("policy", ["round_robin", "prefix_aware"])
def test_shared_prefix_hits_the_engine_that_holds_it(
    proxy_for: Callable[[str], Proxy], tier: Tier, policy: str
) -> None:
    if policy not in policy_names():
        pytest.skip(f"policy {policy!r} is not in this build")
    proxy = proxy_for(policy)
    block = int(cache_config(tier.engines[0].url)["block_size"])
    prefix, prefix_tokens = long_prefix(tier, 5 * block)
    cached_per_hit = (prefix_tokens // block) * block  # vLLM caches full blocks only

    hits_before = {
        e.backend_id: engine_metric(e.url, "vllm:prefix_cache_hits_total") for e in tier.engines
    }
    served: list[str] = []
    for i in range(REQUESTS):
        body = {
            "model": tier.model,
            "prompt": f"{prefix}question {i} about the road",
            "max_tokens": 2,
        }
        r = httpx.post(f"{proxy.url}/v1/completions", json=body, timeout=120)
        assert r.status_code == 200, r.text
        served.append(r.headers["x-fleet-backend"])
    hits = {
        e.backend_id: engine_metric(e.url, "vllm:prefix_cache_hits_total")
        - hits_before[e.backend_id]
        for e in tier.engines
    }

    counts = Counter(served)
    for backend_id, n in counts.items():
        # Every request after the first on an engine finds the prefix it already holds.
        assert hits[backend_id] >= (n - 1) * cached_per_hit, (served, hits)
    for backend_id in hits.keys() - counts.keys():
        assert hits[backend_id] == 0, (served, hits)
    if policy == "round_robin":
        assert len(counts) == len(tier.engines)  # spread: each engine computed the prefix once
    else:
        # A prefix-aware policy keeps the prefix where it is cached.
        assert served == [served[0]] * REQUESTS, served
        assert hits[served[0]] >= (REQUESTS - 1) * cached_per_hit
