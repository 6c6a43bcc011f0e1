"""The SLA decision against hand-computed cases.

The profile: TTFT(isl) = isl / 4000 s (0.25 s at 1000 tokens), and an ITL curve independent of
the context: 0.01 s at 1 in flight, 0.02 s at 10, 0.05 s at 20 (linear between). Tokens/s per
engine n / ITL(n) rise to 500 at n = 10 and fall after it. With rate 10 req/s, ISL 1000,
OSL 100, TTFT target 0.5 s, ITL target 0.03 s:

    prefill = ceil(10 * 0.25) = 3
    decode: n* = 10 (ITL 0.02 <= 0.03, 500 tokens/s), decode = ceil(10 * 100 / 500) = 2
"""

from __future__ import annotations

import dataclasses

import pytest

from fleet.types import Role
from planner.config import PlannerConfig, PlannerMode, PlannerRole, Topology
from planner.decide import PlannerState, Reason
from planner.observe import Sample
from planner.profile_file import SlaProfiles
from planner.sla import DecodeGrid, PrefillCurve
from planner.sla_decide import decide_sla
from planner.traffic import BackendReading, Forecast, RequestCounters

ITL_CURVE = ((1.0, 0.01), (10.0, 0.02), (20.0, 0.05))
PROFILES = SlaProfiles(
    prefill=PrefillCurve(((0.0, 0.0), (4000.0, 1.0))),
    prefill_config="tp1",
    prefill_num_gpu=1,
    decode=DecodeGrid(((0.0, ITL_CURVE), (8000.0, ITL_CURVE))),
    decode_config="tp1",
    decode_num_gpu=1,
)
CONFIG = PlannerConfig(
    mode=PlannerMode.SLA, ttft_target=0.5, itl_target=0.03, sla_profile="profile.json"
)
TRAFFIC = Forecast(rate=10.0, isl=1000.0, osl=100.0)


def decided(
    prefill: int = 1,
    decode: int = 1,
    forecast: Forecast = TRAFFIC,
    config: PlannerConfig = CONFIG,
    history: list[Sample] | None = None,
    profiles: SlaProfiles = PROFILES,
    **state: object,
) -> dict[PlannerRole, tuple[int, int | None, Reason]]:
    """Role -> (desired, target, reason) at the first due adjustment."""
    s = PlannerState(prefill, decode, last_adjustment_at=0.0, **state)  # type: ignore[arg-type]
    d = decide_sla(history or [], s, config, profiles, forecast, now=30.0)
    assert d.due
    return {r.role: (r.desired, r.target, r.reason) for r in d.roles}


def test_hand_computed_targets_one_step_at_a_time() -> None:
    assert decided() == {
        PlannerRole.PREFILL: (2, 3, Reason.SLA_UP),  # target 3, one step from 1
        PlannerRole.DECODE: (2, 2, Reason.SLA_UP),
    }
    assert decided(prefill=3, decode=2) == {
        PlannerRole.PREFILL: (3, 3, Reason.SLA_HOLD),
        PlannerRole.DECODE: (2, 2, Reason.SLA_HOLD),
    }
    assert decided(prefill=6, decode=6) == {
        PlannerRole.PREFILL: (5, 3, Reason.SLA_DOWN),
        PlannerRole.DECODE: (5, 2, Reason.SLA_DOWN),
    }


def test_no_traffic_shrinks_to_the_minimum() -> None:
    idle = Forecast(rate=0.0, isl=None, osl=None)
    assert decided(2, 2, idle) == {
        PlannerRole.PREFILL: (1, 0, Reason.SLA_DOWN),
        PlannerRole.DECODE: (1, 0, Reason.SLA_DOWN),
    }
    assert decided(1, 1, idle)[PlannerRole.DECODE] == (1, 0, Reason.HOLD_MIN_REPLICAS)


@pytest.mark.parametrize(
    "forecast", [Forecast(None, None, None), Forecast(5.0, None, 100.0)], ids=["none", "no isl"]
)
def test_nothing_to_forecast_from_holds(forecast: Forecast) -> None:
    for desired, target, reason in decided(2, 2, forecast).values():
        assert (desired, target, reason) == (2, None, Reason.HOLD_NO_DATA)


def test_decode_grace_holds_a_scale_down() -> None:
    got = decided(6, 6, decode_grace_left=1)
    assert got[PlannerRole.DECODE] == (6, 2, Reason.HOLD_GRACE)
    assert got[PlannerRole.PREFILL] == (5, 3, Reason.SLA_DOWN)


def test_budget_cuts_prefill_first() -> None:
    got = decided(config=dataclasses.replace(CONFIG, max_gpu_budget=3))
    assert got[PlannerRole.PREFILL] == (1, 3, Reason.HOLD_BUDGET)
    assert got[PlannerRole.DECODE] == (2, 2, Reason.SLA_UP)


def test_budget_counts_the_profiles_gpus_per_engine() -> None:
    tp2 = dataclasses.replace(PROFILES, decode_num_gpu=2)
    # 1 + 2 * 2 = 5 GPUs fit a budget of 5; prefill's step would make 6.
    got = decided(config=dataclasses.replace(CONFIG, max_gpu_budget=5), profiles=tp2)
    assert got[PlannerRole.PREFILL] == (1, 3, Reason.HOLD_BUDGET)
    assert got[PlannerRole.DECODE] == (2, 2, Reason.SLA_UP)


def test_replica_cap() -> None:
    got = decided(config=dataclasses.replace(CONFIG, max_prefill_replicas=1))
    assert got[PlannerRole.PREFILL] == (1, 3, Reason.HOLD_MAX_REPLICAS)


def test_a_target_no_count_meets_is_reported() -> None:
    # ITL target 0.005 s: even one request in flight (0.01 s) misses, so n* = 1 and
    # decode = ceil(10 * 100 * 0.01 / 1) = 10.
    tight = dataclasses.replace(CONFIG, itl_target=0.005, max_gpu_budget=100)
    assert decided(3, 10, config=tight)[PlannerRole.DECODE] == (10, 10, Reason.SLA_TARGET_MISSED)
    assert decided(3, 9, config=tight)[PlannerRole.DECODE] == (10, 10, Reason.SLA_UP)


def reading(role: Role, running: float, **counters: float) -> BackendReading:
    return BackendReading(role.value, role, running, RequestCounters(**counters))


def test_corrections_from_the_observed_latencies() -> None:
    # Over 1 s: the prefill engine's TTFT is 0.5 s at ISL 1000, twice the profile's 0.25 s;
    # the decode engine's ITL is 0.04 s at 10 in flight, twice the profile's 0.02 s.
    history = [
        Sample(1.0, None, None, 1, 1, (reading(Role.PREFILL, 0), reading(Role.DECODE, 10))),
        Sample(
            2.0,
            None,
            None,
            1,
            1,
            (
                reading(
                    Role.PREFILL, 0, prompt_len_sum=10_000, prompt_len_count=10, ttft_sum=5,
                    ttft_count=10,
                ),
                reading(
                    Role.DECODE, 10, requests_finished=10, prompt_len_sum=10_000,
                    prompt_len_count=10, output_len_sum=1_000, output_len_count=10, itl_sum=4,
                    itl_count=100,
                ),
            ),
        ),
    ]  # fmt: skip
    s = PlannerState(5, 1, last_adjustment_at=0.0)
    d = decide_sla(history, s, CONFIG, PROFILES, TRAFFIC, now=30.0)
    assert d.sla is not None
    assert d.sla.ttft_correction == pytest.approx(2.0)
    assert d.sla.itl_correction == pytest.approx(2.0)
    # Prefill: s = 0.25 * 2 = 0.5 s, ceil(10 * 0.5) = 5.
    assert d.role(PlannerRole.PREFILL).target == 5
    # Decode: ITL target 0.03 / 2 = 0.015 s; n* = 5 (ITL 0.01 + 0.01 * 4 / 9 = 0.01444 s),
    # decode = ceil(10 * 100 * 0.01444 / 5) = ceil(2.889) = 3.
    assert d.role(PlannerRole.DECODE).target == 3
    assert d.role(PlannerRole.DECODE).meets_target is True


def test_aggregated_plans_the_larger_of_the_two() -> None:
    agg = dataclasses.replace(CONFIG, topology=Topology.AGGREGATED)
    assert decided(config=agg) == {PlannerRole.DECODE: (2, 3, Reason.SLA_UP)}  # max(3, 2)


def test_not_due_holds_like_the_load_rules() -> None:
    early = decide_sla([], PlannerState(1, 1, 0.0), CONFIG, PROFILES, TRAFFIC, now=10.0)
    assert (early.due, early.held_by) == (False, Reason.TOO_EARLY)
    busy = PlannerState(1, 1, 0.0, change_in_progress=True)
    assert decide_sla([], busy, CONFIG, PROFILES, TRAFFIC, 30.0).held_by is Reason.HOLD_IN_PROGRESS


def test_no_operation_reports_without_applying() -> None:
    noop = dataclasses.replace(CONFIG, no_operation=True)
    d = decide_sla([], PlannerState(1, 1, 0.0), noop, PROFILES, TRAFFIC, now=30.0)
    assert d.changes() and not d.apply and d.held_by is Reason.NO_OPERATION
