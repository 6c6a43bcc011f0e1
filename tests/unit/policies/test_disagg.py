"""The disaggregation profile handler and its selective decider (the policy side of prefill/decode disaggregation)."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleet.types import Backend, Role
from policies.policy import NoCandidate
from policies.registry import build_routing
from tests.unit.policies.builders import backend, ctx, text_blocks


def pd_policy(**handler: Any) -> Any:
    return build_routing(
        {
            "plugins": [
                {"type": "prefill-endpoints-filter", "name": "prefill-only"},
                {"type": "decode-endpoints-filter", "name": "decode-only"},
                {"type": "lmetric-picker", "name": "lmetric"},
                {"type": "token-load-scorer", "name": "tokens"},
                {"type": "max-score-picker", "name": "max", "params": {"seed": 0}},
                {"type": "disagg-profile-handler", "name": "pd", "params": handler},
            ],
            "profiles": [
                {
                    "name": "prefill",
                    "filters": ["prefill-only"],
                    "scorers": ["tokens"],
                    "picker": "max",
                },
                {"name": "decode", "filters": ["decode-only"], "picker": "lmetric"},
            ],
        }
    )


def pd_fleet() -> list[Backend]:
    return [
        backend("p0", role=Role.PREFILL),
        backend("p1", role=Role.PREFILL),
        backend("d0", role=Role.DECODE),
        backend("d1", role=Role.DECODE),
    ]


@pytest.mark.parametrize(
    ("decider", "blocks", "outcome"),
    [
        ("always", 1, "disaggregated"),
        ("selective", 1, "short_prompt"),  # 16 tokens <= 512
        ("selective", 64, "disaggregated"),  # 1024 uncached tokens
    ],
)
def test_decider(decider: str, blocks: int, outcome: str) -> None:
    policy = pd_policy(decider=decider, uncached_threshold_tokens=512)
    d = policy.pick(ctx(text_blocks(blocks), debug=True), pd_fleet(), 0.0)
    assert d.target.role is Role.DECODE
    assert (d.prefill is not None) == (outcome == "disaggregated")
    if d.prefill is not None:
        assert d.prefill.role is Role.PREFILL
    assert outcome in d.reason
    assert d.scores[d.target.id]["pd.disaggregated"] == (1.0 if d.prefill else 0.0)
    assert policy.stats()["pd"] == {outcome: 1}


def test_cached_prompt_on_the_decode_backend_prefills_locally() -> None:
    policy = pd_policy(uncached_threshold_tokens=512)
    bs = pd_fleet()
    first = policy.pick(ctx(text_blocks(64)), bs, 0.0)
    assert first.prefill is not None  # the decode backend receives the KV: it is recorded there
    again = policy.pick(ctx(text_blocks(66), debug=True), bs, 0.0)
    assert again.target is first.target
    assert again.prefill is None and "short_prompt (uncached 32 tokens)" in again.reason


def test_saturated_prefill_pool_prefills_on_decode() -> None:
    policy = pd_policy(uncached_threshold_tokens=0, saturation_pending_tokens=1000)
    bs = pd_fleet()
    bs[0].load.pending_prefill_tokens = 1000
    bs[1].load.pending_prefill_tokens = 5000
    d = policy.pick(ctx(text_blocks(64)), bs, 0.0)
    assert d.prefill is None and "prefill_saturated" in d.reason
    bs[0].load.pending_prefill_tokens = 999
    assert policy.pick(ctx(text_blocks(64, "y")), bs, 0.0).prefill is bs[0]


def test_no_prefill_backend_still_serves_and_no_decode_is_no_candidate() -> None:
    policy = pd_policy(decider="always")
    decode_only = [b for b in pd_fleet() if b.role is Role.DECODE]
    d = policy.pick(ctx(text_blocks(64)), decode_only, 0.0)
    assert d.prefill is None and "no_prefill_backend" in d.reason
    with pytest.raises(NoCandidate):
        policy.pick(ctx("x"), [b for b in pd_fleet() if b.role is Role.PREFILL], 0.0)


def test_decisions_are_counted_in_metrics() -> None:
    policy = pd_policy()
    registry = CollectorRegistry()
    policy.bind_metrics(registry, dict)
    policy.pick(ctx(text_blocks(1)), pd_fleet(), 0.0)
    assert registry.get_sample_value("fleet_pd_decisions_total", {"outcome": "short_prompt"}) == 1


def test_handler_profiles_must_exist() -> None:
    with pytest.raises(ValueError, match="needs profile 'prefill'"):
        build_routing(
            {
                "plugins": [
                    {"type": "round-robin-picker", "name": "rr"},
                    {"type": "disagg-profile-handler", "name": "pd"},
                ],
                "profiles": [{"name": "decode", "picker": "rr"}],
            }
        )
