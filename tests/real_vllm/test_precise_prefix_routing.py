"""The proxy's precise prefix index, fed by the real engines' KV-cache events, holds what the
engines really hold: a prompt cached on one engine behind the proxy's back is routed there,
scored from events, and the engine then reports exactly the blocks the proxy counted as hits.

Needs the tier started with `engines.py start --kv-events` (run_tier.sh does).
"""

from __future__ import annotations

import random
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from tests.real_vllm.tier import (
    Engine,
    Proxy,
    Tier,
    cache_config,
    engine_metric,
    start_proxy,
)
from tests.support.polling import holds_within_blocking

pytestmark = pytest.mark.real_vllm

# Bounds for what must come on 2 loaded cores, not expected durations.
WAIT = 60.0


def unique_ids(n: int) -> list[int]:
    rng = random.Random(uuid.uuid4().int)
    return [rng.randrange(100, 2000) for _ in range(n)]


def precise_config(tier: Tier, path: Path) -> Path:
    backends = [
        {
            "url": e.url,
            "kv_events_endpoint": e.kv_events_endpoint,
            "kv_events_replay_endpoint": e.kv_events_replay_endpoint,
        }
        for e in tier.engines
    ]
    config = {
        "backends": backends,
        "kv_events_topic": tier.kv_events_topic,
        "debug_receipts": True,
        "routing": {
            "plugins": [
                {"type": "precise-prefix-cache-scorer", "name": "prefix"},
                {"type": "max-score-picker", "name": "best"},
            ],
            "profiles": [{"name": "default", "scorers": ["prefix"], "picker": "best"}],
        },
    }
    path.write_text(yaml.safe_dump(config))
    return path


def kv_metric(proxy: Proxy, name: str, backend_id: str) -> float:
    text = httpx.get(f"{proxy.url}/metrics", timeout=30).text
    prefix = f'fleet_proxy_kv_{name}{{backend="{backend_id}"}} '
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    return -1.0


def complete(url: str, tier: Tier, prompt: list[int], headers: dict[str, str] | None = None) -> Any:
    body = {"model": tier.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    r = httpx.post(f"{url}/v1/completions", json=body, headers=headers or {}, timeout=WAIT)
    assert r.status_code == 200, r.text
    return r


def test_a_prompt_cached_behind_the_proxys_back_is_routed_to_its_engine(
    kv_events_tier: Tier, tmp_path: Path
) -> None:
    tier = kv_events_tier
    proxy = start_proxy(tier, "precise", tmp_path, config=precise_config(tier, tmp_path / "p.yaml"))
    try:
        for holder in tier.engines:
            check_routed_to(proxy, tier, holder)
    finally:
        proxy.stop()


def check_routed_to(proxy: Proxy, tier: Tier, holder: Engine) -> None:
    block = int(cache_config(holder.url)["block_size"])
    # Five full blocks and a partial one: vLLM caches (and announces) the full ones only.
    prompt = unique_ids(5 * block + block // 2)
    blocks_before = kv_metric(proxy, "blocks_indexed", holder.backend_id)
    complete(holder.url, tier, prompt)  # straight to the engine: the proxy routed nothing

    # The engine's events reach the proxy: its index for the holder grows by those blocks
    # (at least; the one generated token fills no block) and stands in routing for it.
    assert holds_within_blocking(
        lambda: (
            kv_metric(proxy, "blocks_indexed", holder.backend_id) >= blocks_before + 5
            and kv_metric(proxy, "index_precise", holder.backend_id) == 1.0
        ),
        WAIT,
    ), proxy.log_tail()

    hits_before = engine_metric(holder.url, "vllm:prefix_cache_hits_total")
    r = complete(proxy.url, tier, prompt, {"x-fleet-debug": "1"})
    assert r.headers["x-fleet-backend"] == holder.backend_id
    scores = orjson.loads(r.headers["x-fleet-decision"])["scores"]
    for engine in tier.engines:
        seen = scores[engine.backend_id]
        assert seen["from_events"] == 1.0, (engine.backend_id, seen)
        # 5 of the prompt's 5 full blocks on the holder, none of this fresh prompt elsewhere.
        assert seen["prefix"] == (1.0 if engine is holder else 0.0), (engine.backend_id, seen)
    # The engine's own count of cached tokens served: exactly the five full blocks the
    # proxy's index said it held (the scorer's 5 of 5 full blocks).
    hits = engine_metric(holder.url, "vllm:prefix_cache_hits_total") - hits_before
    assert hits == 5 * block
