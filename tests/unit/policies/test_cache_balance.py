"""cache_balance: each rule and tie-breaker of the pure decision, then the picker over a real
prefix index filled by its own earlier choices."""

from __future__ import annotations

from typing import Any

import pytest

from policies.pickers.cache_balance import CacheBalanceParams, Decision, View, decide
from policies.registry import RoutingConfigError, build_policy
from tests.unit.policies.builders import backend, ctx, text_blocks

P = CacheBalanceParams()


def v(bs: float = 0, cached: int = 0, pending: float = 0, blocks: int = 0, recent: int = 0) -> View:
    return View(bs=bs, cached=cached, pending=pending, blocks=blocks, recent=recent)


def run(
    views: list[View], tokens: int = 100, full: bool = False, start: int = 0, **kw: Any
) -> Decision:
    return decide(views, tokens, P.model_copy(update=kw), full, start)


def test_owner_above_the_threshold_and_not_overloaded_takes_it() -> None:
    # 40/100 > 0.3; owner BS 4 <= avg 2.5 x 2
    assert run([v(bs=2), v(bs=4, cached=40), v(bs=2), v(bs=2)]) == Decision(1, "owner")


def test_the_threshold_is_strict() -> None:
    d = run([v(bs=1, blocks=5), v(bs=1, cached=30, blocks=9)])
    assert d == Decision(0, "cold")  # 30/100 is not > 0.3


def test_an_overloaded_owner_leaves_it_to_lmetric_under_the_ceiling() -> None:
    # avg (9+1+2+0)/4 = 3; owner 9 > 3 x 2. LMetric: b1 (100 x 1), b2 (100 x 2), b3 (100 x 0)
    views = [v(bs=9, cached=90), v(bs=1), v(bs=2), v(bs=0, pending=500)]
    assert run(views, balance_abs_threshold=100) == Decision(3, "lmetric")


def test_lmetric_ties_prefer_the_cache_then_the_lower_bs() -> None:
    # owner overloaded; b1 and b2 both score 0 (BS 0): b2 holds more of the prompt
    views = [v(bs=9, cached=90), v(bs=0), v(bs=0, cached=20)]
    assert run(views, balance_abs_threshold=100) == Decision(2, "lmetric")


def test_a_cold_request_goes_to_the_smallest_footprint() -> None:
    views = [v(bs=1, blocks=50), v(bs=2, blocks=10), v(bs=0, blocks=30)]
    assert run(views) == Decision(1, "cold")


def test_cold_placement_skips_a_backend_over_the_ceiling() -> None:
    # avg 2, ceiling 4: b0 (BS 5) is out though it caches least
    views = [v(bs=5, blocks=0), v(bs=1, blocks=10), v(bs=0, blocks=20)]
    assert run(views) == Decision(1, "cold")


def test_cold_ties_go_to_the_lower_bs_then_rotation() -> None:
    assert run([v(bs=2), v(bs=1), v(bs=1)]) == Decision(1, "cold")
    assert run([v(bs=2), v(bs=1), v(bs=1)], start=2) == Decision(2, "cold")


def test_owner_ties_go_to_the_lower_bs_then_rotation() -> None:
    views = [v(bs=2, cached=50), v(bs=1, cached=50), v(bs=1, cached=50)]
    assert run(views) == Decision(1, "owner")
    assert run(views, start=2) == Decision(2, "owner")


@pytest.mark.parametrize(
    ("loads", "imbalanced"),
    [
        ([10, 1], True),  # 9 > 8 and 10 > 1.5
        ([9, 1], False),  # 8 is not > 8
        ([30, 21], False),  # 9 > 8 but 30 is not > 1.5 x 21
        ([33, 21], True),
    ],
)
def test_the_load_switch_needs_both_the_absolute_and_the_relative_gap(
    loads: list[int], imbalanced: bool
) -> None:
    d = run([v(bs=loads[0], cached=90), v(bs=loads[1])], overload_factor=10)
    assert d == (Decision(1, "imbalance") if imbalanced else Decision(0, "owner"))


def test_imbalance_ties_prefer_the_cache() -> None:
    views = [v(bs=20), v(bs=1), v(bs=1, cached=10)]
    assert run(views) == Decision(2, "imbalance")


def test_the_spread_guard_leaves_out_a_backend_chosen_over_the_factor() -> None:
    # mean recent 25: b0 at 40 > 32.5 is out, though it owns the prompt
    views = [
        v(bs=1, cached=90, recent=40),
        v(bs=1, recent=20),
        v(bs=1, recent=20, blocks=5),
        v(bs=1, recent=20),
    ]
    assert run(views, full=True) == Decision(1, "cold")
    assert run(views, full=False) == Decision(0, "owner")  # not before the warm-up


def test_the_spread_guard_always_leaves_one() -> None:
    views = [v(recent=100), v(recent=0)]
    assert run(views, full=True, spread_factor=1.0) == Decision(1, "cold")


def test_bad_params_are_refused() -> None:
    with pytest.raises(RoutingConfigError, match="balance_rel_threshold"):
        build_policy("cache_balance", {"balance_rel_threshold": 0.5})


def test_the_picker_follows_its_own_index_and_places_cold_prompts_where_least_is_cached() -> None:
    policy = build_policy("cache_balance")
    a, b, c = backend("a"), backend("b"), backend("c")
    # a holds 8 blocks of one conversation, b 2 blocks of another, c nothing
    policy.pick(ctx(text_blocks(8, "p")), [a], 0.0)
    policy.pick(ctx(text_blocks(2, "q")), [b], 0.0)
    turn = policy.pick(ctx(text_blocks(10, "p")), [a, b, c], 0.0)
    assert turn.target is a and turn.reason == "cache_balance: owner"
    cold = policy.pick(ctx(text_blocks(4, "z")), [a, b, c], 0.0)
    assert cold.target is c and cold.reason == "cache_balance: cold"
    assert policy.stats()["cache_balance"]["owner"] == 1


def test_the_guard_waits_for_its_warm_up() -> None:
    policy = build_policy("cache_balance", {"spread_warmup": 3})
    a, b = backend("a"), backend("b")
    for _ in range(2):
        policy.pick(ctx(text_blocks(8, "p")), [a], 0.0)
    assert policy.pick(ctx(text_blocks(8, "p")), [a, b], 0.0).target is a  # 2 choices: no guard
    assert policy.pick(ctx(text_blocks(8, "p")), [a, b], 0.0).target is b  # 3: a sits out


def test_the_picker_window_counts_only_the_last_choices() -> None:
    policy = build_policy("cache_balance", {"spread_window": 4, "spread_warmup": 4})
    a, b = backend("a"), backend("b")
    for _ in range(4):
        policy.pick(ctx(text_blocks(8, "p")), [a], 0.0)
    # the window is a,a,a,a: a (4 > 2 x 1.3) is left out though it owns the prompt
    assert policy.pick(ctx(text_blocks(8, "p")), [a, b], 0.0).target is b
    for _ in range(3):
        policy.pick(ctx(text_blocks(8, "p")), [b], 0.0)
    # the window is now b,b,b,b: b is left out, though it holds the prompt as a does
    assert policy.pick(ctx(text_blocks(8, "p")), [a, b], 0.0).target is a
