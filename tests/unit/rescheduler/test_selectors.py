from __future__ import annotations

import pytest

from rescheduler.selectors import (
    Scored,
    consolidation_pair,
    metric_balance_pairs,
    mitigation_pair,
    round_robin,
)


@pytest.mark.parametrize(
    ("sources", "targets", "min_gap", "expected"),
    [
        # the worked example's cluster, threshold 0.7: 0.9 -> 0.2, 0.8 -> 0.3
        (
            [("d1", 0.9), ("d3", 0.8)],
            [("d2", 0.3), ("d4", 0.2), ("d5", 0.4)],
            0.0,
            [("d1", "d4"), ("d3", "d2")],
        ),
        # pairing stops at the first pair not differing by more than min_gap
        ([("a", 0.9), ("b", 0.5)], [("c", 0.1), ("d", 0.4)], 0.2, [("a", "c")]),
        # strictly greater: a difference equal to min_gap does not pair
        ([("a", 0.75)], [("c", 0.25)], 0.5, []),
        ([("a", 0.5)], [("c", 0.5)], 0.0, []),
        # more sources than targets: only as many pairs as targets
        ([("a", 0.9), ("b", 0.8)], [("c", 0.1)], 0.0, [("a", "c")]),
        # ties by id: sources a before b, targets c before d
        ([("b", 0.9), ("a", 0.9)], [("d", 0.1), ("c", 0.1)], 0.0, [("a", "c"), ("b", "d")]),
        ([], [("c", 0.1)], 0.0, []),
    ],
)
def test_metric_balance_pairs(
    sources: list[Scored], targets: list[Scored], min_gap: float, expected: list[tuple[str, str]]
) -> None:
    assert metric_balance_pairs(sources, targets, min_gap) == expected


@pytest.mark.parametrize(
    ("sources", "targets", "expected"),
    [
        (
            [("s", ["r0", "r1", "r2", "r3", "r4"])],
            ["t2", "t1"],
            [("s", "t1", ("r0", "r2", "r4")), ("s", "t2", ("r1", "r3"))],
        ),
        # the deal goes on across sources: s2 starts where s1 stopped
        (
            [("s2", ["b0", "b1"]), ("s1", ["a0"])],
            ["t1", "t2", "t3"],
            [("s1", "t1", ("a0",)), ("s2", "t2", ("b0",)), ("s2", "t3", ("b1",))],
        ),
        # a source with nothing gives nothing; a target dealt nothing gets no migration
        ([("s", []), ("u", ["x"])], ["t1", "t2"], [("u", "t1", ("x",))]),
        ([("s", ["x"])], [], []),
    ],
)
def test_round_robin(
    sources: list[tuple[str, list[str]]],
    targets: list[str],
    expected: list[tuple[str, str, tuple[str, ...]]],
) -> None:
    assert round_robin(sources, targets) == expected


def test_mitigation_takes_the_worst_source_with_requests_and_the_lightest_target() -> None:
    sources = [("a", 0.049), ("b", 0.060), ("c", 0.055)]
    targets = [("x", 0.030), ("y", 0.020), ("z", 0.020)]
    assert mitigation_pair(sources, targets, lambda i: True) == ("b", "y")
    assert mitigation_pair(sources, targets, lambda i: i != "b") == ("c", "y")
    assert mitigation_pair(sources, targets, lambda i: False) is None
    assert mitigation_pair(sources, [], lambda i: True) is None


def test_mitigation_never_pairs_an_instance_with_itself() -> None:
    assert mitigation_pair([("a", 0.05)], [("a", 0.05)], lambda i: True) is None
    assert mitigation_pair([("a", 0.05)], [("a", 0.05), ("b", 0.06)], lambda i: True) == (
        "a",
        "b",
    )


def test_consolidation_takes_the_lightest_source_into_the_heaviest_target_that_fits() -> None:
    sources = [("a", 0.020), ("b", 0.010)]
    targets = [("a", 0.020), ("b", 0.010), ("x", 0.040), ("y", 0.035)]
    assert consolidation_pair(sources, targets, lambda i: True, lambda s, t: True) == ("b", "x")
    # x would be pushed over: the next heaviest that fits
    assert consolidation_pair(sources, targets, lambda i: True, lambda s, t: t != "x") == (
        "b",
        "y",
    )
    # the lightest source fits nowhere but itself: the next source is tried
    assert consolidation_pair(
        sources, targets, lambda i: True, lambda s, t: s == "a" and t == "b"
    ) == ("a", "b")
    assert consolidation_pair(sources, targets, lambda i: i == "a", lambda s, t: True) == (
        "a",
        "x",
    )
    assert consolidation_pair(sources, targets, lambda i: True, lambda s, t: False) is None
