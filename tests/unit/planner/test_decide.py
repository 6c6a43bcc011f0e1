"""The load-based rules over scripted metric histories."""

from __future__ import annotations

import dataclasses

import pytest

from planner.config import PlannerRole
from planner.decide import (
    Change,
    PlannerState,
    Reason,
    advance,
    change_done,
    decide,
    queue_trend,
)
from tests.unit.planner.builders import AGG, CFG, INTERVAL, history, state

P, D = PlannerRole.PREFILL, PlannerRole.DECODE
IN_BAND_Q, IN_BAND_KV = 0.3, 0.7


@pytest.mark.parametrize(
    ("queue", "kv", "want_p", "want_d"),
    [
        (0.6, IN_BAND_KV, (3, Reason.SCALE_UP_QUEUE), (2, Reason.HOLD_IN_BAND)),
        (0.1, IN_BAND_KV, (1, Reason.SCALE_DOWN_QUEUE), (2, Reason.HOLD_IN_BAND)),
        (IN_BAND_Q, 0.95, (2, Reason.HOLD_IN_BAND), (3, Reason.SCALE_UP_KV)),
        (IN_BAND_Q, 0.4, (2, Reason.HOLD_IN_BAND), (1, Reason.SCALE_DOWN_KV)),
        (IN_BAND_Q, IN_BAND_KV, (2, Reason.HOLD_IN_BAND), (2, Reason.HOLD_IN_BAND)),
        # Exactly at a threshold is in band: the rules compare strictly.
        (0.5, 0.9, (2, Reason.HOLD_IN_BAND), (2, Reason.HOLD_IN_BAND)),
        (0.2, 0.5, (2, Reason.HOLD_IN_BAND), (2, Reason.HOLD_IN_BAND)),
        (None, None, (2, Reason.HOLD_NO_DATA), (2, Reason.HOLD_NO_DATA)),
    ],
)
def test_each_threshold_both_ways(
    queue: float | None,
    kv: float | None,
    want_p: tuple[int, Reason],
    want_d: tuple[int, Reason],
) -> None:
    d = decide(history(queue, kv), state(), CFG, now=INTERVAL)
    assert d.due and d.held_by is None
    assert (d.role(P).desired, d.role(P).reason) == want_p
    assert (d.role(D).desired, d.role(D).reason) == want_d
    assert d.apply == (want_p[0] != 2 or want_d[0] != 2)


def test_the_interval_mean_decides_not_the_last_sample() -> None:
    # KV spikes to 1.0 for the last 5 s only: the mean (0.7*25 + 5)/30 = 0.75 is in band.
    kv = [0.7] * 25 + [1.0] * 5
    assert decide(history(IN_BAND_Q, kv), state(), CFG, INTERVAL).role(D).reason is (
        Reason.HOLD_IN_BAND
    )
    # ... and mostly-high with one dip is over 0.9: (0.95*29 + 0.5)/30 = 0.935.
    kv = [0.95] * 29 + [0.5]
    assert decide(history(IN_BAND_Q, kv), state(), CFG, INTERVAL).role(D).desired == 3


def test_only_the_intervals_samples_count() -> None:
    # The previous interval was overloaded; this one is in band.
    old = history(0.9, 0.99, start=0)
    new = history(IN_BAND_Q, IN_BAND_KV, start=30)
    d = decide(old + new, state(last=30.0), CFG, now=60.0)
    assert d.samples == 30
    assert d.changes() == ()


def test_at_most_one_worker_per_role_per_interval() -> None:
    # Massively overloaded and idle: still +-1.
    d = decide(history(50.0, 1.0), state(2, 2), CFG, INTERVAL)
    assert d.desired() == {P: 3, D: 3}
    d = decide(history(0.0, 0.0), state(4, 4), CFG, INTERVAL)
    assert d.desired() == {P: 3, D: 3}


def test_too_early_before_the_interval_has_elapsed() -> None:
    d = decide(history(0.9, 0.99, seconds=29), state(), CFG, now=29.9)
    assert not d.due and not d.apply
    assert d.held_by is Reason.TOO_EARLY
    assert {r.reason for r in d.roles} == {Reason.TOO_EARLY}
    assert d.changes() == ()


def test_nothing_while_a_change_is_in_progress() -> None:
    s = state(change_in_progress=True)
    d = decide(history(0.9, 0.99), s, CFG, now=120.0)
    assert not d.due and not d.apply
    assert d.held_by is Reason.HOLD_IN_PROGRESS
    assert d.desired() == {P: 2, D: 2}
    # The same history once the change is done and a full interval has passed.
    s = change_done(s, now=90.0)
    assert not s.change_in_progress and s.last_adjustment_at == 90.0
    assert not decide(history(0.9, 0.99, start=90), s, CFG, now=119.0).due
    assert decide(history(0.9, 0.99, start=90), s, CFG, now=120.0).desired() == {P: 3, D: 3}


def test_an_applied_change_blocks_until_done() -> None:
    s0 = state()
    d = decide(history(0.9, IN_BAND_KV), s0, CFG, INTERVAL)
    s1 = advance(s0, d, CFG)
    assert s1.change_in_progress and s1.prefill_replicas == 3 and s1.last_adjustment_at == 30
    held = decide(history(0.9, IN_BAND_KV, start=30), s1, CFG, now=60.0)
    assert held.held_by is Reason.HOLD_IN_PROGRESS
    assert advance(s1, held, CFG) == s1


def test_decode_grace_holds_scale_down_for_the_next_three_adjustments() -> None:
    s = state()
    up = decide(history(IN_BAND_Q, 0.95), s, CFG, INTERVAL)
    s = advance(s, up, CFG)
    assert (s.decode_replicas, s.decode_added_at, s.decode_grace_left) == (3, 30.0, 3)
    s = change_done(s, now=40.0)
    reasons = []
    for k in range(1, 5):
        now = 40.0 + k * INTERVAL + 0.5 * k  # adjustments run a little late; counting is exact
        d = decide(history(IN_BAND_Q, 0.1, start=now - INTERVAL), s, CFG, now)
        reasons.append(d.role(D).reason)
        s = advance(s, d, CFG)
        if d.apply:
            s = change_done(s, now)
    assert reasons == [Reason.HOLD_GRACE] * 3 + [Reason.SCALE_DOWN_KV]
    assert s.decode_replicas == 2


def test_grace_does_not_hold_a_scale_up_or_prefill() -> None:
    s = state(decode_grace_left=2)
    assert decide(history(0.1, 0.95), s, CFG, INTERVAL).desired() == {P: 1, D: 3}


def test_prefill_trend_holds_a_scale_up_when_the_queue_is_draining() -> None:
    # The queue falls from 2.0 by 0.05 a second: mean 1.275 > 0.5, but the line reaches
    # 0.5 long before 90 s from now.
    falling = [2.0 - 0.05 * i for i in range(30)]
    d = decide(history(falling, IN_BAND_KV), state(), CFG, INTERVAL)
    p = d.role(P)
    assert p.reason is Reason.HOLD_TREND and p.desired == 2
    # Least squares through (t, 2.05 - 0.05 t): 2.05 - 0.05 * (30 + 90) = -3.95.
    assert p.predicted == pytest.approx(-3.95)
    assert p.load == pytest.approx(1.275)


def test_prefill_trend_lets_a_slowly_draining_queue_scale_up() -> None:
    # Falls 0.001/s from 1.0: at 30 + 90 s the line is still ~0.88 > 0.5.
    slow = [1.0 - 0.001 * i for i in range(30)]
    d = decide(history(slow, IN_BAND_KV), state(), CFG, INTERVAL)
    assert d.role(P).reason is Reason.SCALE_UP_QUEUE
    assert d.role(P).predicted == pytest.approx(1.001 - 0.001 * 120)


def test_a_rising_queue_scales_up_and_a_zero_buffer_only_looks_at_now() -> None:
    rising = [0.4 + 0.02 * i for i in range(30)]
    assert decide(history(rising, IN_BAND_KV), state(), CFG, INTERVAL).role(P).desired == 3
    # A steep fall ending at 0.55 > 0.5: with no buffer period it still scales up.
    falling = [0.55 + 0.05 * (29 - i) for i in range(30)]
    cfg = dataclasses.replace(CFG, new_prefill_worker_queue_buffer_period=0)
    assert decide(history(falling, IN_BAND_KV), state(), cfg, INTERVAL).role(P).desired == 3
    assert decide(history(falling, IN_BAND_KV), state(), CFG, INTERVAL).role(P).desired == 2


def test_queue_trend_is_the_least_squares_slope() -> None:
    assert queue_trend([(0, 1), (1, 3), (2, 2)]) == pytest.approx(0.5)
    assert queue_trend([(5, 1)]) is None
    assert queue_trend([(5, 1), (5, 2)]) is None


@pytest.mark.parametrize(
    ("replicas", "queue", "kv", "want", "reasons"),
    [
        # At the 8-GPU ceiling and both want up: no room for either.
        ((4, 4), 0.9, 0.99, {P: 4, D: 4}, (Reason.HOLD_BUDGET, Reason.HOLD_BUDGET)),
        # One GPU left, both want up: decode gets it, prefill yields.
        ((3, 4), 0.9, 0.99, {P: 3, D: 5}, (Reason.HOLD_BUDGET, Reason.SCALE_UP_KV)),
        # At the ceiling, decode idle and prefill queued: they trade in one interval.
        ((4, 4), 0.9, 0.1, {P: 5, D: 3}, (Reason.SCALE_UP_QUEUE, Reason.SCALE_DOWN_KV)),
    ],
)
def test_gpu_budget_ceiling(
    replicas: tuple[int, int],
    queue: float,
    kv: float,
    want: dict[PlannerRole, int],
    reasons: tuple[Reason, Reason],
) -> None:
    d = decide(history(queue, kv), state(*replicas), CFG, INTERVAL)
    assert d.desired() == want
    assert (d.role(P).reason, d.role(D).reason) == reasons


def test_gpu_budget_floor_keeps_decode_when_both_want_down() -> None:
    cfg = dataclasses.replace(CFG, min_gpu_budget=3)
    d = decide(history(0.0, 0.0), state(2, 2), cfg, INTERVAL)
    assert d.desired() == {P: 1, D: 2}
    assert d.role(D).reason is Reason.HOLD_BUDGET
    d = decide(history(0.0, 0.0), state(2, 1), cfg, INTERVAL)
    assert d.desired() == {P: 2, D: 1}
    assert d.role(P).reason is Reason.HOLD_BUDGET


def test_gpu_budget_counts_gpus_per_engine() -> None:
    cfg = dataclasses.replace(CFG, decode_engine_num_gpu=4)  # 2 + 2*4 = 10 > 8 already
    d = decide(history(IN_BAND_Q, 0.99), state(1, 1), cfg, INTERVAL)  # 1 + 4 = 5; +4 = 9
    assert d.role(D).reason is Reason.HOLD_BUDGET
    d = decide(history(0.9, IN_BAND_KV), state(1, 1), cfg, INTERVAL)  # 2 + 4 = 6 <= 8
    assert d.desired() == {P: 2, D: 1}


def test_replica_bounds() -> None:
    d = decide(history(0.0, 0.0), state(1, 1), CFG, INTERVAL)
    assert (d.role(P).reason, d.role(D).reason) == (
        Reason.HOLD_MIN_REPLICAS,
        Reason.HOLD_MIN_REPLICAS,
    )
    cfg = dataclasses.replace(CFG, max_prefill_replicas=2, max_decode_replicas=2)
    d = decide(history(0.9, 0.99), state(2, 2), cfg, INTERVAL)
    assert d.changes() == ()
    assert d.role(P).reason is Reason.HOLD_MAX_REPLICAS


def test_no_operation_reports_but_does_not_apply() -> None:
    cfg = dataclasses.replace(CFG, no_operation=True)
    s = state()
    d = decide(history(0.9, 0.99), s, cfg, INTERVAL)
    assert d.due and not d.apply
    assert d.held_by is Reason.NO_OPERATION
    assert d.changes() == (Change(P, 2, 3), Change(D, 2, 3))
    assert (d.role(P).reason, d.role(D).reason) == (Reason.SCALE_UP_QUEUE, Reason.SCALE_UP_KV)
    after = advance(s, d, cfg)
    assert after == dataclasses.replace(s, last_adjustment_at=INTERVAL)  # nothing else moves


def test_an_aggregated_fleet_plans_one_role() -> None:
    s = PlannerState(prefill_replicas=0, decode_replicas=2, last_adjustment_at=0.0)
    d = decide(history(None, 0.95), s, AGG, INTERVAL)
    assert [r.role for r in d.roles] == [D]
    assert d.changes() == (Change(D, 2, 3),)
    s2 = advance(s, d, AGG)
    assert (s2.prefill_replicas, s2.decode_replicas) == (0, 3)
    # Its budget counts decode GPUs only: 8 aggregated workers fill it.
    s = dataclasses.replace(s, decode_replicas=8)
    assert decide(history(None, 0.95), s, AGG, INTERVAL).role(D).reason is Reason.HOLD_BUDGET


def test_decide_is_pure() -> None:
    h, s = history(0.9, 0.1), state()
    first = decide(h, s, CFG, INTERVAL)
    assert decide(h, s, CFG, INTERVAL) == first
    assert s == state()


def test_asking_for_a_role_the_fleet_does_not_plan_raises() -> None:
    with pytest.raises(KeyError):
        decide(history(0.9, 0.1), state(), AGG, INTERVAL).role(P)
