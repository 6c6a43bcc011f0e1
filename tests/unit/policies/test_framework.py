"""The Filter -> Score -> Pick pipeline (policies/scheduler.py, policies/profile.py)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.pickers.score import MaxScorePicker
from policies.policy import NoCandidate
from policies.profile import Profile, WeightedScorer
from policies.registry import build_routing
from tests.unit.policies.builders import backend, ctx, fleet


class FixedScorer(PluginBase):
    """An input to the pipeline, not the thing under test: fixed scores per backend id."""

    type = "fixed"

    def __init__(self, name: str, scores: dict[str, float]) -> None:
        super().__init__(name)
        self.scores = scores

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        return [self.scores[b.id] for b in candidates]


def request(debug: bool = True) -> SchedulingRequest:
    return SchedulingRequest(ctx(debug=debug), 0.0, RoutingServices(64, 100), explain=debug)


def test_seed_example_final_score_is_the_weighted_sum() -> None:
    # Seed 001: Scorer A (weight 2.0) returns 0.8 and Scorer B (weight 1.0) returns 0.5 -> 2.1.
    x, y = backend("x"), backend("y")
    profile = Profile(
        "p",
        [],
        [
            WeightedScorer(FixedScorer("A", {"x": 0.8, "y": 1.0}), 2.0),
            WeightedScorer(FixedScorer("B", {"x": 0.5, "y": 0.0}), 1.0),
        ],
        MaxScorePicker(seed=0),
    )
    req = request()
    assert profile.run(req, [x, y]) is x
    assert req.receipt["x"]["p.total"] == pytest.approx(2.1)
    assert req.receipt["y"]["p.total"] == pytest.approx(2.0)
    assert req.receipt["x"]["A"] == 0.8 and req.receipt["x"]["B"] == 0.5


def test_filters_run_in_order_and_an_empty_result_is_no_candidate() -> None:
    policy = build_routing(
        {
            "plugins": [
                {
                    "type": "label-selector-filter",
                    "name": "zone-a",
                    "params": {"match_labels": {"zone": "a"}},
                },
                {
                    "type": "label-selector-filter",
                    "name": "gpu-h100",
                    "params": {"match_labels": {"gpu": "h100"}},
                },
                {"type": "round-robin-picker", "name": "rr"},
            ],
            "profiles": [{"name": "p", "filters": ["zone-a", "gpu-h100"], "picker": "rr"}],
        }
    )
    a100 = backend("a100", labels={"zone": "a", "gpu": "a100"})
    h100 = backend("h100", labels={"zone": "a", "gpu": "h100"})
    other = backend("other", labels={"zone": "b", "gpu": "h100"})
    for _ in range(3):
        assert policy.pick(ctx(), [a100, other, h100], 0.0).target is h100
    with pytest.raises(NoCandidate, match="gpu-h100 left no candidate"):
        policy.pick(ctx(), [a100, other], 0.0)


def test_receipt_only_when_debugging() -> None:
    policy = build_routing({"policy": "lmetric"})
    quiet = policy.pick(ctx("hello"), fleet(2), 0.0)
    assert quiet.scores == {}
    loud = policy.pick(ctx("hello", debug=True), fleet(2), 0.0)
    assert set(loud.scores) == {"b0", "b1"}
    assert set(loud.scores["b0"]) >= {"p_tokens", "bs", "lmetric", "uncached_tokens"}
    assert loud.reason == "lmetric"


def test_explain_all_fills_every_receipt() -> None:
    policy = build_routing({"policy": "least_requests", "explain_all": True})
    assert policy.pick(ctx(), fleet(2), 0.0).scores["b1"] == {"in_flight": 0.0}


def test_no_candidates_at_all_is_no_candidate() -> None:
    with pytest.raises(NoCandidate):
        build_routing({"policy": "round_robin"}).pick(ctx(), [], 0.0)


def test_cached_share_is_measured_in_the_bytes_blocks_are_cut_in() -> None:
    services = RoutingServices(64, 100)
    index = services.use_prefix_index()
    text = "é" * 64  # 128 UTF-8 bytes: two blocks
    index.record("a", index.hashes(text[:32], "m"))  # one block
    req = SchedulingRequest(ctx(text, tokens=100), 0.0, services)
    assert req.cache_ratio("a") == pytest.approx(0.5)
    assert req.uncached_tokens("a") == 50
