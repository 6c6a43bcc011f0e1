"""least_prefill: the work formula and each tie-breaker of the pure decision, then the picker
over a real prefix index filled by its own earlier choices and over live pending counts."""

from __future__ import annotations

from typing import Any

import pytest

from policies.pickers.cache_balance import View
from policies.pickers.least_prefill import LeastPrefillParams, Rule, decide
from policies.registry import RoutingConfigError, build_policy
from tests.unit.policies.builders import backend, ctx, text_blocks

P = LeastPrefillParams()


def v(
    bs: float = 0,
    cached: int = 0,
    pending: float = 0,
    blocks: int = 0,
    recent: int = 0,
    decoding: float = 0,
) -> View:
    return View(
        bs=bs, cached=cached, pending=pending, blocks=blocks, recent=recent, decoding=decoding
    )


def run(
    views: list[View], tokens: int = 1000, guard: bool = False, start: int = 0, **kw: Any
) -> tuple[int, Rule]:
    return decide(views, tokens, P.model_copy(update=kw), guard, start)


def test_the_holder_of_the_history_takes_the_next_turn_when_nothing_waits() -> None:
    assert run([v(bs=1), v(bs=1, cached=900), v(bs=1)]) == (1, "cached")


def test_a_long_prefill_in_progress_sends_a_short_prompt_elsewhere() -> None:
    # b0 holds the prompt but prefills 5,000 tokens of another conversation first
    views = [v(bs=1, cached=90, pending=5000), v(bs=1)]
    assert run(views, tokens=100) == (1, "cold")


def test_the_holder_keeps_the_turn_while_its_queue_costs_less_than_the_history() -> None:
    # b0: 1,500 pending + 100 uncached = 1,600; b1: 1,000 + 1.0 x 900 = 1,900
    assert run([v(bs=1, cached=900, pending=1500), v(bs=1)]) == (0, "cached")
    # b0: 2,000 + 100 = 2,100 > 1,900
    assert run([v(bs=1, cached=900, pending=2000), v(bs=1)]) == (1, "cold")


@pytest.mark.parametrize(("weight", "chosen"), [(0.0, 1), (0.2, 1), (0.5, 0), (1.0, 0)])
def test_the_recompute_weight_charges_the_prefill_a_choice_repeats(
    weight: float, chosen: int
) -> None:
    # b0: 1,100 pending + 100 uncached = 1,200; b1: 1,000 + weight x 900
    views = [v(bs=1, cached=900, pending=1100), v(bs=1)]
    assert run(views, recompute_weight=weight)[0] == chosen


def test_each_decode_running_there_weighs_on_the_uncached_tokens() -> None:
    # b0: 0 + 1,000 x (1 + 3) = 4,000; b1: 2,000 pending + 1,000 = 3,000
    views = [v(bs=3, decoding=3), v(bs=2, pending=2000)]
    assert run(views) == (1, "cold")
    assert run(views, decode_weight=0.0) == (0, "cold")
    # b0 holds 900 of 1,000 tokens: 100 x 4 = 400 < b1's 3,000 + 900
    assert run([v(bs=3, decoding=3, cached=900), v(bs=2, pending=2000)]) == (0, "cached")


def test_a_cold_prompt_goes_to_the_smallest_footprint_then_the_lower_bs() -> None:
    assert run([v(bs=1, blocks=50), v(bs=2, blocks=10), v(bs=1, blocks=30)]) == (1, "cold")
    assert run([v(bs=2, blocks=10), v(bs=1, blocks=10)]) == (1, "cold")


def test_full_ties_go_by_rotation() -> None:
    assert run([v(), v(), v()], start=0)[0] == 0
    assert run([v(), v(), v()], start=2)[0] == 2


def test_a_backend_over_the_ceiling_is_left_out_while_another_is_under_it() -> None:
    # avg 10/3, ceiling 6.7: b0 (BS 8) is out though it holds the whole prompt
    views = [v(bs=8, cached=1000), v(bs=1), v(bs=1)]
    assert run(views) == (1, "cold")
    assert run(views, ceiling_factor=3.0) == (0, "cached")


def test_the_spread_guard_acts_only_when_set_and_warm() -> None:
    views = [v(bs=1, cached=900, recent=40), v(bs=1, recent=10)]
    assert run(views, guard=True) == (0, "cached")  # no spread_factor: no guard
    assert run(views, guard=True, spread_factor=1.3) == (1, "cold")
    assert run(views, guard=False, spread_factor=1.3) == (0, "cached")


def test_bad_params_are_refused() -> None:
    with pytest.raises(RoutingConfigError, match="recompute_weight"):
        build_policy("least_prefill", {"recompute_weight": -1})


def test_the_picker_reads_its_index_and_the_pending_tokens_of_each_backend() -> None:
    policy = build_policy("least_prefill")
    a, b, c = backend("a"), backend("b"), backend("c")
    policy.pick(ctx(text_blocks(8, "p")), [a], 0.0)  # a now holds 8 blocks of "p"
    policy.pick(ctx(text_blocks(2, "q")), [b], 0.0)
    turn = policy.pick(ctx(text_blocks(10, "p")), [a, b, c], 0.0)
    assert turn.target is a and turn.reason == "least_prefill: cached"
    cold = policy.pick(ctx(text_blocks(4, "z")), [a, b, c], 0.0)
    assert cold.target is c and cold.reason == "least_prefill: cold"
    # a busy prefilling another conversation: the next turn of "p" goes elsewhere, to b,
    # which caches less than c
    a.load.pending_prefill_tokens = 10_000
    assert policy.pick(ctx(text_blocks(12, "p")), [a, b, c], 0.0).target is b
    assert policy.stats()["least_prefill"] == {"cached": 1, "cold": 4}


def test_a_debug_request_shows_each_figure_the_decision_read() -> None:
    policy = build_policy("least_prefill")
    a, b = backend("a", in_flight=2, pending=300, decoding=1), backend("b")
    d = policy.pick(ctx(text_blocks(4, "p"), debug=True), [a, b], 0.0)
    assert d.target is b
    assert d.scores["a"] == {
        "bs": 2,
        "pending_prefill_tokens": 300,
        "cached_tokens": 0,
        "index_blocks": 0,
        "decoding": 1,
    }
