"""prefix_index.max_blocks (match only a prompt's first blocks) and auto_capacity (size each
backend's LRU from its cache config, or keep capacity_blocks)."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import EngineMetrics
from policies.registry import build_routing
from policies.scheduler import Scheduler
from tests.unit.policies.builders import backend, ctx, text_blocks


def prefix_policy(**index: Any) -> Scheduler:
    return build_routing(
        {
            "prefix_index": index,
            "plugins": [
                {"type": "prefix-cache-scorer", "name": "prefix"},
                {"type": "max-score-picker", "name": "best", "params": {"seed": 0}},
            ],
            "profiles": [{"name": "default", "scorers": ["prefix"], "picker": "best"}],
        }
    )


@pytest.mark.parametrize(("max_blocks", "score"), [(None, 2 / 5), (2, 1.0), (3, 2 / 3)])
def test_max_blocks_caps_what_is_matched(max_blocks: int | None, score: float) -> None:
    policy = prefix_policy(max_blocks=max_blocks)
    fleet = [backend("a"), backend("b")]
    first = text_blocks(5, "x")
    policy.pick(ctx(first), fleet, 0)
    owner = policy.pick(ctx(first, debug=True), fleet, 0).target.id
    # Same first two blocks, then different ones: a prefix hit of 2 blocks on the owner.
    d = policy.pick(ctx(first[:128] + text_blocks(3, "y"), debug=True), fleet, 0)
    assert d.scores[owner]["prefix"] == pytest.approx(score)


@pytest.mark.parametrize(("auto", "held"), [(True, 4), (False, 10)])
def test_auto_capacity_sizes_the_lru_from_the_cache_config(auto: bool, held: int) -> None:
    policy = prefix_policy(auto_capacity=auto)
    # 16-token blocks x 4 GPU blocks = 64 tokens = 256 characters = 4 blocks of 64
    b = backend("a", scraped=EngineMetrics(block_size=16, num_gpu_blocks=4))
    policy.pick(ctx(text_blocks(10)), [b], 0)
    index = policy.services.prefix_index
    assert index is not None and index.backend_blocks("a") == held
