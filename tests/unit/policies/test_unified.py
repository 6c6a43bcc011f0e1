"""The hybrid "unified" policy: affinity gate, else LMetric; plus the hard ceiling."""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import Backend
from policies.registry import build_policy
from tests.unit.policies.builders import backend, ctx, text_blocks


def with_owner(params: dict[str, Any] | None = None) -> tuple[Any, Backend, list[Backend]]:
    """A unified policy where session "s" is owned by `owner`, which holds 8 blocks of it."""
    policy = build_policy("unified", params)
    owner = backend("owner")
    others = [backend(f"o{i}") for i in range(3)]
    policy.pick(ctx(text_blocks(8), session="s"), [owner], 0.0)
    return policy, owner, [owner, *others]


@pytest.mark.parametrize(
    ("case", "prompt_blocks", "owner_in_flight", "others_in_flight", "expected"),
    [
        # cache_ratio = 8 cached / 10 blocks = 0.8 > 0.5; owner load 3 <= avg 1.5 x 2.0
        ("both gates pass -> affinity", 10, 3, [1, 1, 1], "owner"),
        # ratio 8/16 = 0.5 is not > 0.5: LMetric decides (idle o0 beats busy owner)
        ("gate 1 fails at exactly 0.5", 16, 1, [0, 0, 0], "other"),
        # owner 7 > avg (7+1+1+1)/4 x 2 = 5: overloaded
        ("gate 2 fails -> lmetric", 10, 7, [1, 1, 1], "other"),
    ],
)
def test_affinity_gate(
    case: str, prompt_blocks: int, owner_in_flight: int, others_in_flight: list[int], expected: str
) -> None:
    policy, owner, bs = with_owner()
    owner.load.in_flight = owner_in_flight
    for b, n in zip(bs[1:], others_in_flight, strict=True):
        b.load.in_flight = n
    d = policy.pick(ctx(text_blocks(prompt_blocks), session="s", debug=True), bs, 0.0)
    got = "owner" if d.target is owner else "other"
    assert got == expected, (case, d.reason, d.scores)


def test_affinity_beats_a_lower_lmetric_score() -> None:
    # The gate routes to the owner even where LMetric alone would go elsewhere.
    policy, owner, bs = with_owner()
    owner.load.in_flight, owner.load.pending_prefill_tokens = 2, 3000
    for b in bs[1:]:
        b.load.in_flight = 2
    d = policy.pick(ctx(text_blocks(10), session="s", debug=True), bs, 0.0)
    assert d.target is owner and "affinity" in d.reason
    assert d.scores["owner"]["cache_ratio"] == pytest.approx(0.8)
    lmetric = build_policy("lmetric")
    assert lmetric.pick(ctx(text_blocks(10)), bs, 0.0).target is not owner


def test_sessions_without_owner_use_lmetric_and_become_owned() -> None:
    policy = build_policy("unified")
    bs = [backend(f"b{i}") for i in range(3)]
    first = policy.pick(ctx(text_blocks(8), session="new"), bs, 0.0).target
    bs[0].load.in_flight = bs[1].load.in_flight = bs[2].load.in_flight = 1
    assert policy.pick(ctx(text_blocks(9), session="new"), bs, 0.0).target is first
    assert policy.stats()["unified"]["affinity_hits"] == 1


@pytest.mark.parametrize(
    ("form", "prompt_blocks", "ceiling", "breaks"),
    [
        # The usual case: the request has at least one uncached block, so the owner's
        # P_tokens x BS > 0 while idle backends score 0: LMetric leaves the owner, with or
        # without the ceiling.
        ("one uncached block, no ceiling", 9, None, True),
        ("one uncached block, with the ceiling", 9, 2.0, True),
        # The open edge case: cache_ratio = 1.0. Without a ceiling the owner's product is 0
        # and it wins the uncached-tokens tie-breaker: re-elected despite overload
        # (gate-then-LMetric's behaviour, kept reachable with ceiling_factor null). The hard
        # ceiling settles it.
        ("fully cached, no ceiling re-elects the owner", 8, None, False),
        ("fully cached, the hard ceiling breaks affinity", 8, 2.0, True),
    ],
)
def test_hybrid_high_cache_breaks_on_overload(
    form: str, prompt_blocks: int, ceiling: float | None, breaks: bool
) -> None:
    policy, owner, bs = with_owner({"ceiling_factor": ceiling})
    owner.load.in_flight = 12  # avg (12 + 0 + 0 + 0) / 4 = 3; 12 > 3 x 2.0: overloaded
    d = policy.pick(ctx(text_blocks(prompt_blocks), session="s", debug=True), bs, 0.0)
    assert (d.target is not owner) == breaks, (form, d.reason, d.scores)
    if breaks:
        assert "lmetric" in d.reason


def test_ceiling_is_soft_when_everyone_is_over_it() -> None:
    policy = build_policy("unified")
    bs = [backend("a", in_flight=5), backend("b", in_flight=5)]
    assert policy.pick(ctx(text_blocks(2)), bs, 0.0).target.id in {"a", "b"}


def test_owner_gone_from_candidates_falls_back() -> None:
    policy, owner, bs = with_owner()
    d = policy.pick(ctx(text_blocks(10), session="s"), bs[1:], 0.0)
    assert d.target is not owner
    policy.on_backend_removed("owner")
    assert policy.stats()["unified"]["sessions"] == 1  # now owned by the fallback choice
