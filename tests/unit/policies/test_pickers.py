"""Score pickers and the load-balancing baselines."""

from __future__ import annotations

from collections import Counter

import pytest

from policies.framework import RoutingServices, SchedulingRequest
from policies.pickers.score import MaxScorePicker, RandomPicker, WeightedRandomPicker
from policies.registry import build_policy
from tests.unit.policies.builders import backend, ctx, fleet


def req() -> SchedulingRequest:
    return SchedulingRequest(ctx(), 0.0, RoutingServices(64, 100))


def test_round_robin_cycles() -> None:
    policy = build_policy("round_robin")
    bs = fleet(3)
    assert [policy.pick(ctx(), bs, 0.0).target.id for _ in range(6)] == ["b0", "b1", "b2"] * 2


@pytest.mark.parametrize(
    ("in_flight", "expected"),
    [([3, 1, 2], {"b1"}), ([0, 0, 0], {"b0", "b1", "b2"}), ([5, 0, 0], {"b1", "b2"})],
)
def test_least_requests_picks_the_minimum_and_rotates_ties(
    in_flight: list[int], expected: set[str]
) -> None:
    policy = build_policy("least_requests")
    bs = [backend(f"b{i}", in_flight=n) for i, n in enumerate(in_flight)]
    assert {policy.pick(ctx(), bs, 0.0).target.id for _ in range(6)} == expected


def test_power_of_two_prefers_the_less_loaded_of_its_two_samples() -> None:
    policy = build_policy("power_of_two", {"seed": 3})
    two = [backend("busy", in_flight=9), backend("idle")]
    assert {policy.pick(ctx(), two, 0.0).target.id for _ in range(20)} == {"idle"}
    # With many backends the most loaded one is never chosen (it always loses its pair).
    many = [backend("hot", in_flight=100), *fleet(4)]
    counts = Counter(policy.pick(ctx(), many, 0.0).target.id for _ in range(200))
    assert "hot" not in counts and len(counts) == 4


def test_random_picker_reaches_everyone_and_is_reproducible() -> None:
    bs = fleet(4)
    picker1, picker2 = RandomPicker(seed=7), RandomPicker(seed=7)
    seq1 = [picker1.pick(req(), bs, [0.0] * 4).id for _ in range(50)]
    seq2 = [picker2.pick(req(), bs, [0.0] * 4).id for _ in range(50)]
    assert seq1 == seq2
    assert set(seq1) == {"b0", "b1", "b2", "b3"}
    policy = build_policy("random", {"seed": 7})
    assert {policy.pick(ctx(), bs, 0.0).target.id for _ in range(50)} == set(seq1)


@pytest.mark.parametrize(
    ("totals", "allowed"),
    [
        ([0.1, 0.9, 0.9], {"b1", "b2"}),
        ([3.0, 0.0, 0.0], {"b0"}),
        ([1.0, 1.0, 1.0], {"b0", "b1", "b2"}),
    ],
)
def test_max_score_picker_breaks_ties_at_random(totals: list[float], allowed: set[str]) -> None:
    picker = MaxScorePicker(seed=1)
    seen = {picker.pick(req(), fleet(3), totals).id for _ in range(60)}
    assert seen == allowed


def test_weighted_random_follows_the_scores() -> None:
    picker = WeightedRandomPicker(seed=2)
    counts = Counter(picker.pick(req(), fleet(3), [3.0, 1.0, 0.0]).id for _ in range(4000))
    assert counts["b2"] == 0
    assert 2.5 < counts["b0"] / counts["b1"] < 3.5
    # All-zero scores: uniform.
    assert len({picker.pick(req(), fleet(3), [0.0] * 3).id for _ in range(60)}) == 3
