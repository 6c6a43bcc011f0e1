from __future__ import annotations

from typing import Any

import pytest

from rescheduler.config import SelectOrder, SelectRule
from rescheduler.select import order_requests, select_requests
from rescheduler.view import RequestView
from tests.unit.rescheduler.builders import inst, req

# Running r1..r4 with distinct arrivals and lengths; waiting w1, w2; one unmovable of each.
MIXED = (
    req("r1", arrived=1, prompt=300),
    req("r2", arrived=2, prompt=100),
    req("r3", arrived=3, prompt=400),
    req("r4", arrived=4, prompt=200),
    req("r-pinned", arrived=0, prompt=50, movable=False),
    req("w2", arrived=6, prompt=10, running=False),
    req("w1", arrived=5, prompt=900, running=False),
    req("w-pinned", arrived=0, prompt=5, running=False, movable=False),
)
RUNNING_ONLY = tuple(r for r in MIXED if r.running)


@pytest.mark.parametrize(
    ("requests", "order", "expected"),
    [
        (MIXED, SelectOrder.LCR, ["r4", "r3", "r2", "r1"]),
        (MIXED, SelectOrder.FCR, ["r1", "r2", "r3", "r4"]),
        (MIXED, SelectOrder.LR, ["r3", "r1", "r4", "r2"]),
        (MIXED, SelectOrder.SR, ["r2", "r4", "r1", "r3"]),
        (MIXED, SelectOrder.FCW, ["w1", "w2"]),
        (MIXED, SelectOrder.FCWSR, ["w1", "w2"]),
        (RUNNING_ONLY, SelectOrder.FCWSR, ["r2", "r4", "r1", "r3"]),
        (RUNNING_ONLY, SelectOrder.FCW, []),
    ],
)
def test_orders(requests: tuple[RequestView, ...], order: SelectOrder, expected: list[str]) -> None:
    assert [r.key for r in order_requests(requests, order)] == expected


def test_generated_tokens_count_in_sequence_length() -> None:
    short_prompt_long_answer = req("a", prompt=10, generated=500)
    long_prompt = req("b", prompt=300)
    assert [
        r.key for r in order_requests((short_prompt_long_answer, long_prompt), SelectOrder.LR)
    ] == [
        "a",
        "b",
    ]


@pytest.mark.parametrize("order", [SelectOrder.LCR, SelectOrder.FCR, SelectOrder.SR])
def test_ties_are_broken_by_key(order: SelectOrder) -> None:
    same = (req("b", arrived=1), req("c", arrived=1), req("a", arrived=1))
    assert [r.key for r in order_requests(same, order)] == ["a", "b", "c"]


CAPPED: dict[str, Any] = {"num_gpu_blocks": 100, "block_size": 10}  # 1000 tokens


@pytest.mark.parametrize(
    ("rule", "order", "value", "capacity", "expected"),
    [
        (SelectRule.NUM_REQ, SelectOrder.SR, 2, {}, ("r2", "r4")),
        (SelectRule.NUM_REQ, SelectOrder.SR, 2.9, {}, ("r2", "r4")),
        (SelectRule.NUM_REQ, SelectOrder.SR, 0, {}, ()),
        (SelectRule.NUM_REQ, SelectOrder.LR, 99, {}, ("r3", "r1", "r4", "r2")),
        # SR: 100 + 200 = 300 <= 350, adding 300 would exceed
        (SelectRule.TOKEN, SelectOrder.SR, 350, {}, ("r2", "r4")),
        (SelectRule.TOKEN, SelectOrder.SR, 300, {}, ("r2", "r4")),  # equal to the budget fits
        # the first request moves even when it alone is over the budget
        (SelectRule.TOKEN, SelectOrder.LR, 10, {}, ("r3",)),
        # the prefix stops at the first misfit instead of skipping to a smaller request
        (SelectRule.TOKEN, SelectOrder.LR, 750, {}, ("r3", "r1")),
        (SelectRule.TOKEN, SelectOrder.FCW, 100, {}, ("w1",)),
        # RATIO with capacity: 0.35 * 1000 = 350 tokens
        (SelectRule.RATIO, SelectOrder.SR, 0.35, CAPPED, ("r2", "r4")),
        # RATIO without capacity: 0.35 * (all requests' 1965 tokens) = 687.75
        (SelectRule.RATIO, SelectOrder.SR, 0.35, {}, ("r2", "r4", "r1")),
    ],
)
def test_rules(
    rule: SelectRule,
    order: SelectOrder,
    value: float,
    capacity: dict[str, Any],
    expected: tuple[str, ...],
) -> None:
    source = inst("s", requests=MIXED, **capacity)
    assert select_requests(source, rule, order, value) == expected


def test_nothing_movable_selects_nothing() -> None:
    source = inst("s", requests=(req("a", movable=False), req("b", running=False, movable=False)))
    for order in SelectOrder:
        assert select_requests(source, SelectRule.TOKEN, order, 10_000) == ()


def test_explicit_request_subset_is_used_but_capacity_is_the_sources() -> None:
    source = inst("s", requests=MIXED, **CAPPED)
    assert select_requests(
        source, SelectRule.RATIO, SelectOrder.FCWSR, 0.35, requests=RUNNING_ONLY
    ) == ("r2", "r4")
