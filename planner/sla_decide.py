"""The SLA mode's decision: `decide_sla(history, state, config, profiles, forecast, now)`.

Each role's target replicas come from the SLA arithmetic (planner/sla.py) on the forecast
request rate, ISL and OSL of the next interval, with the corrections the interval's
observations give (planner/traffic.py):

    c_ttft = observed TTFT / TTFT_profile(ISL the TTFT was observed at)
    c_itl  = observed ITL / ITL_profile(round(observed in-flight per engine), observed context)
    prefill target = prefill_replicas(rate, ISL, c_ttft).replicas
    decode target  = decode_replicas(rate, ISL, OSL, c_itl).replicas

A forecast rate of 0 targets no replica (the bounds keep the minimum). In an aggregated fleet
only decode is planned and its target is the larger of the two: an aggregated worker prefills
and decodes, so the fleet needs at least as many as either job alone, and the corrections,
taken from the aggregated workers' own TTFT and ITL, carry what the two jobs cost each other
on one engine. Its prefill curve is that of the decode configuration (the workers run it).

Then the load-based mode's rules (planner/decide.py), unchanged: nothing while a change is in
progress or before the interval is up, one step per role per interval toward the target
(`sla_up`, `sla_down`; `sla_hold` at it, `sla_target_missed` at it when the profile cannot
meet the latency target at any count), no decode scale-down within the grace after a decode
addition, the replica bounds, and the GPU budget with the GPUs per engine of the profile's
configurations. No forecast yet: `hold_no_data`.

Pure: no I/O, no clock; the forecast is passed in (the predictors are the runtime's,
planner/sla_mode.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from planner.config import PlannerConfig, PlannerRole, Topology
from planner.decide import (
    Decision,
    PlannerState,
    Reason,
    RoleDecision,
    bounded,
    conclude,
    due_hold,
    fit_budget,
    held,
    interval,
)
from planner.observe import Sample
from planner.profile_file import SlaProfiles
from planner.sla import correction, decode_replicas, prefill_replicas
from planner.traffic import Forecast, SlaInputs, Traffic, observe_traffic


def decide_sla(
    history: Sequence[Sample],
    state: PlannerState,
    config: PlannerConfig,
    profiles: SlaProfiles,
    forecast: Forecast,
    now: float,
) -> Decision:
    hold = due_hold(state, config, now)
    if hold is not None:
        return held(hold, state, config, now)
    # The budget counts the GPUs of the engines the profile measured.
    config = dataclasses.replace(
        config,
        prefill_engine_num_gpu=profiles.prefill_num_gpu,
        decode_engine_num_gpu=profiles.decode_num_gpu,
    )
    window = interval(history, state, now)
    observed = observe_traffic(window)
    inputs = SlaInputs(forecast, observed, *corrections(observed, profiles))
    targets = sla_targets(inputs, config, profiles)
    proposed = [
        bounded(_step(role, state, targets), config)
        if role in targets
        else RoleDecision(role, state.replicas(role), state.replicas(role), Reason.HOLD_NO_DATA)
        for role in config.roles
    ]
    return conclude(fit_budget(proposed, config), config, now, len(window), inputs)


def corrections(observed: Traffic | None, profiles: SlaProfiles) -> tuple[float, float]:
    """(c_ttft, c_itl) from the interval's observations; 1 for what was not observed."""
    if observed is None:
        return 1.0, 1.0
    c_ttft = 1.0
    if observed.ttft is not None and observed.ttft_isl is not None:
        c_ttft = correction(observed.ttft, profiles.prefill.ttft(observed.ttft_isl))
    c_itl = 1.0
    if observed.itl is not None and observed.in_flight is not None and observed.context:
        in_flight = max(1, round(observed.in_flight))
        c_itl = correction(observed.itl, profiles.decode.itl(in_flight, observed.context))
    return c_ttft, c_itl


def sla_targets(
    inputs: SlaInputs, config: PlannerConfig, profiles: SlaProfiles
) -> dict[PlannerRole, tuple[int, bool]]:
    """Role -> (target replicas, whether the profile meets the latency target); a role with
    nothing to go on is absent."""
    f = inputs.forecast
    if f.rate is None:
        return {}
    if f.rate <= 0:
        return {role: (0, True) for role in config.roles}
    if f.isl is None or f.osl is None:
        return {}
    ttft_target = config.ttft_target or 0.0  # check_config: set in sla mode
    itl_target = config.itl_target or 0.0
    prefill = prefill_replicas(f.rate, f.isl, profiles.prefill, ttft_target, inputs.ttft_correction)
    decode = decode_replicas(
        f.rate, f.isl, f.osl, profiles.decode, itl_target, inputs.itl_correction
    )
    if config.topology is Topology.AGGREGATED:
        both = max(prefill.replicas, decode.replicas)
        return {PlannerRole.DECODE: (both, prefill.meets_target and decode.meets_target)}
    return {
        PlannerRole.PREFILL: (prefill.replicas, prefill.meets_target),
        PlannerRole.DECODE: (decode.replicas, decode.meets_target),
    }


def _step(
    role: PlannerRole, state: PlannerState, targets: dict[PlannerRole, tuple[int, bool]]
) -> RoleDecision:
    """One worker toward the target, as the load-based rules move."""
    current = state.replicas(role)
    target, meets = targets[role]

    def decision(desired: int, reason: Reason) -> RoleDecision:
        return RoleDecision(role, current, desired, reason, target=target, meets_target=meets)

    if target > current:
        return decision(current + 1, Reason.SLA_UP)
    if target < current:
        if role is PlannerRole.DECODE and state.decode_grace_left > 0:
            return decision(current, Reason.HOLD_GRACE)
        return decision(current - 1, Reason.SLA_DOWN)
    return decision(current, Reason.SLA_HOLD if meets else Reason.SLA_TARGET_MISSED)
