"""The load-based planner's decision: `decide(history, state, config, now) -> Decision`.

As Dynamo's load-based planner decides, every `adjustment_interval` seconds:

1. Nothing while a change is in progress (`hold_in_progress`), nor before the interval since
   the last adjustment has elapsed (`too_early`).
2. Each role's load is the mean over the interval's samples, those taken in
   (last_adjustment_at, now]:
   - prefill: mean prefill queue utilisation q; q > up: +1 (`scale_up_queue`),
     q < down: -1 (`scale_down_queue`);
   - decode (or aggregated): mean KV-cache utilisation k; k > up: +1 (`scale_up_kv`),
     k < down: -1 (`scale_down_kv`).
   Otherwise hold (`hold_in_band`; `hold_no_data` when the interval has no value).
3. At most one worker per role per interval: the rules above only ever say +-1.
4. Decode is not scaled down at the `new_decode_worker_grace_period` adjustments that follow
   a decode addition (`hold_grace`): the new worker's KV cache is still filling.
5. Prefill is not scaled up when the queue's trend says it will be under the up threshold
   within `new_prefill_worker_queue_buffer_period` intervals (`hold_trend`): with the
   least-squares line through the interval's samples (t_i, q_i), slope
       b = sum((t_i - t_mean)(q_i - q_mean)) / sum((t_i - t_mean)^2)
   the predicted queue is q_mean + b * (now + period * adjustment_interval - t_mean), the
   line's value at the end of the buffer period. Fewer than two distinct sample times: no trend.
6. Replica bounds per role (`hold_min_replicas`, `hold_max_replicas`).
7. GPU budget: total = prefill * prefill_engine_num_gpu + decode * decode_engine_num_gpu
   after the changes stays within [min_gpu_budget, max_gpu_budget] (`hold_budget`). Downs
   and ups are netted, so one role may give the GPUs another takes in the same interval.
   When the budget binds, decode capacity wins: an excess is cut from prefill's scale-up
   first, a shortfall from decode's scale-down first (too little KV cache preempts and
   recomputes running requests; a longer prefill queue only delays first tokens). A fleet
   already outside the budget is not forced back; it is only kept from moving further out.
8. `no_operation`: the decision is computed and reported but marked not to be applied.

Pure: no I/O, no clock; the runtime passes `now`, carries the state with `advance` and
`change_done`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from planner.config import PlannerConfig, PlannerRole
from planner.observe import Sample
from planner.traffic import SlaInputs


class Reason(StrEnum):
    SCALE_UP_KV = "scale_up_kv"
    SCALE_DOWN_KV = "scale_down_kv"
    SCALE_UP_QUEUE = "scale_up_queue"
    SCALE_DOWN_QUEUE = "scale_down_queue"
    HOLD_IN_BAND = "hold_in_band"
    HOLD_NO_DATA = "hold_no_data"
    HOLD_GRACE = "hold_grace"
    HOLD_TREND = "hold_trend"
    HOLD_MIN_REPLICAS = "hold_min_replicas"
    HOLD_MAX_REPLICAS = "hold_max_replicas"
    HOLD_BUDGET = "hold_budget"
    # SLA mode (planner/sla_decide.py): one step toward the replicas the SLA arithmetic wants,
    # or none; target_missed: at that count, but the profile says no count meets the target.
    SLA_UP = "sla_up"
    SLA_DOWN = "sla_down"
    SLA_HOLD = "sla_hold"
    SLA_TARGET_MISSED = "sla_target_missed"
    # Decision-wide: the whole decision is held (or, for no_operation, not applied).
    HOLD_IN_PROGRESS = "hold_in_progress"
    TOO_EARLY = "too_early"
    NO_OPERATION = "no_operation"


@dataclass(frozen=True, slots=True)
class PlannerState:
    """What the planner carries between decisions."""

    prefill_replicas: int
    decode_replicas: int
    last_adjustment_at: float  # the runtime starts it at the planner's start time
    change_in_progress: bool = False  # blocks both pulling and adjusting
    decode_added_at: float | None = None  # when a decode worker was last added
    # Adjustments still within the grace after that addition. Counted, not timed, so "the
    # next N adjustment intervals" holds exactly however late each adjustment runs.
    decode_grace_left: int = 0

    def replicas(self, role: PlannerRole) -> int:
        return self.prefill_replicas if role is PlannerRole.PREFILL else self.decode_replicas


@dataclass(frozen=True, slots=True)
class Change:
    role: PlannerRole
    current: int
    desired: int


@dataclass(frozen=True, slots=True)
class RoleDecision:
    role: PlannerRole
    current: int
    desired: int  # current +- at most 1
    reason: Reason
    load: float | None = None  # the interval's mean (queue or KV utilisation)
    predicted: float | None = None  # prefill: the queue the trend predicts (rule 5)
    target: int | None = None  # SLA mode: the replicas the SLA arithmetic wants
    meets_target: bool | None = None  # SLA mode: whether the profile meets the latency target


@dataclass(frozen=True, slots=True)
class Decision:
    at: float
    due: bool  # an adjustment was made (interval elapsed, no change in progress)
    apply: bool  # the runtime should carry out `changes()`
    held_by: Reason | None  # too_early, hold_in_progress or no_operation; None otherwise
    roles: tuple[RoleDecision, ...]
    samples: int = 0  # samples in the interval
    sla: SlaInputs | None = None  # SLA mode: the forecast and observations it read

    def role(self, role: PlannerRole) -> RoleDecision:
        for r in self.roles:
            if r.role is role:
                return r
        raise KeyError(role)

    def desired(self) -> dict[PlannerRole, int]:
        return {r.role: r.desired for r in self.roles}

    def changes(self) -> tuple[Change, ...]:
        """(role, from, to) for every role whose desired count differs from its current one."""
        return tuple(
            Change(r.role, r.current, r.desired) for r in self.roles if r.desired != r.current
        )


def decide(
    history: Sequence[Sample], state: PlannerState, config: PlannerConfig, now: float
) -> Decision:
    hold = due_hold(state, config, now)
    if hold is not None:
        return held(hold, state, config, now)
    window = interval(history, state, now)
    proposed = [
        bounded(_prefill(window, state, config, now), config)
        if role is PlannerRole.PREFILL
        else bounded(_decode(window, state, config), config)
        for role in config.roles
    ]
    return conclude(fit_budget(proposed, config), config, now, len(window))


def due_hold(state: PlannerState, config: PlannerConfig, now: float) -> Reason | None:
    """Why no adjustment is made now (rules 1 and 2), or None when one is due."""
    if state.change_in_progress:
        return Reason.HOLD_IN_PROGRESS
    if now - state.last_adjustment_at < config.adjustment_interval:
        return Reason.TOO_EARLY
    return None


def interval(history: Sequence[Sample], state: PlannerState, now: float) -> list[Sample]:
    """The interval's samples: those taken in (last_adjustment_at, now]."""
    return [s for s in history if state.last_adjustment_at < s.at <= now]


def conclude(
    roles: Sequence[RoleDecision],
    config: PlannerConfig,
    now: float,
    samples: int,
    sla: SlaInputs | None = None,
) -> Decision:
    """The due decision over the roles' final proposals (rule 8: no_operation)."""
    has_changes = any(r.desired != r.current for r in roles)
    return Decision(
        at=now,
        due=True,
        apply=has_changes and not config.no_operation,
        held_by=Reason.NO_OPERATION if config.no_operation else None,
        roles=tuple(roles),
        samples=samples,
        sla=sla,
    )


def advance(state: PlannerState, decision: Decision, config: PlannerConfig) -> PlannerState:
    """The state once `decision` has been taken (and, when it applies, its change started)."""
    if not decision.due:
        return state
    nxt = dataclasses.replace(
        state,
        last_adjustment_at=decision.at,
        decode_grace_left=max(0, state.decode_grace_left - 1),
    )
    if not decision.apply:
        return nxt
    desired = decision.desired()
    nxt = dataclasses.replace(
        nxt,
        prefill_replicas=desired.get(PlannerRole.PREFILL, state.prefill_replicas),
        decode_replicas=desired.get(PlannerRole.DECODE, state.decode_replicas),
        change_in_progress=bool(decision.changes()),
    )
    if nxt.decode_replicas > state.decode_replicas:
        nxt = dataclasses.replace(
            nxt,
            decode_added_at=decision.at,
            decode_grace_left=config.new_decode_worker_grace_period,
        )
    return nxt


def change_done(state: PlannerState, now: float) -> PlannerState:
    """The change finished: pulling and adjusting resume, and the next interval starts now,
    so its samples all come from the new fleet."""
    return dataclasses.replace(state, change_in_progress=False, last_adjustment_at=now)


def queue_trend(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (time, value) points; None under two distinct times."""
    if len(points) < 2:
        return None
    t_mean = sum(t for t, _ in points) / len(points)
    v_mean = sum(v for _, v in points) / len(points)
    sxx = sum((t - t_mean) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    return sum((t - t_mean) * (v - v_mean) for t, v in points) / sxx


def held(reason: Reason, state: PlannerState, config: PlannerConfig, now: float) -> Decision:
    """A decision that adjusts nothing: too early, in progress."""
    roles = tuple(
        RoleDecision(role, state.replicas(role), state.replicas(role), reason)
        for role in config.roles
    )
    return Decision(at=now, due=False, apply=False, held_by=reason, roles=roles)


def _prefill(
    window: Sequence[Sample], state: PlannerState, config: PlannerConfig, now: float
) -> RoleDecision:
    role, current = PlannerRole.PREFILL, state.prefill_replicas
    points = [(s.at, s.prefill_queue) for s in window if s.prefill_queue is not None]
    if not points:
        return RoleDecision(role, current, current, Reason.HOLD_NO_DATA)
    mean = sum(q for _, q in points) / len(points)
    if mean > config.prefill_queue_scale_up_threshold:
        slope = queue_trend(points)
        predicted = None
        if slope is not None:
            t_mean = sum(t for t, _ in points) / len(points)
            horizon = (
                now + config.new_prefill_worker_queue_buffer_period * config.adjustment_interval
            )
            predicted = mean + slope * (horizon - t_mean)
            if predicted < config.prefill_queue_scale_up_threshold:
                return RoleDecision(role, current, current, Reason.HOLD_TREND, mean, predicted)
        return RoleDecision(role, current, current + 1, Reason.SCALE_UP_QUEUE, mean, predicted)
    if mean < config.prefill_queue_scale_down_threshold:
        return RoleDecision(role, current, current - 1, Reason.SCALE_DOWN_QUEUE, mean)
    return RoleDecision(role, current, current, Reason.HOLD_IN_BAND, mean)


def _decode(window: Sequence[Sample], state: PlannerState, config: PlannerConfig) -> RoleDecision:
    role, current = PlannerRole.DECODE, state.decode_replicas
    values = [s.decode_kv for s in window if s.decode_kv is not None]
    if not values:
        return RoleDecision(role, current, current, Reason.HOLD_NO_DATA)
    mean = sum(values) / len(values)
    if mean > config.decode_kv_scale_up_threshold:
        return RoleDecision(role, current, current + 1, Reason.SCALE_UP_KV, mean)
    if mean < config.decode_kv_scale_down_threshold:
        if state.decode_grace_left > 0:
            return RoleDecision(role, current, current, Reason.HOLD_GRACE, mean)
        return RoleDecision(role, current, current - 1, Reason.SCALE_DOWN_KV, mean)
    return RoleDecision(role, current, current, Reason.HOLD_IN_BAND, mean)


def bounded(proposal: RoleDecision, config: PlannerConfig) -> RoleDecision:
    """Rule 6: a proposal that would cross the role's replica bounds holds instead."""
    low, high = config.replica_bounds(proposal.role)
    if proposal.desired > proposal.current and high is not None and proposal.desired > high:
        return dataclasses.replace(
            proposal, desired=proposal.current, reason=Reason.HOLD_MAX_REPLICAS
        )
    if proposal.desired < proposal.current and proposal.desired < low:
        return dataclasses.replace(
            proposal, desired=proposal.current, reason=Reason.HOLD_MIN_REPLICAS
        )
    return proposal


def fit_budget(proposed: list[RoleDecision], config: PlannerConfig) -> list[RoleDecision]:
    """Rule 7: the proposals netted within the GPU budget, decode capacity first."""
    by_role = {p.role: p for p in proposed}
    total = sum(p.desired * config.engine_gpus(p.role) for p in proposed)

    def drop(role: PlannerRole) -> None:
        nonlocal total
        p = by_role[role]
        total -= (p.desired - p.current) * config.engine_gpus(role)
        by_role[role] = dataclasses.replace(p, desired=p.current, reason=Reason.HOLD_BUDGET)

    # Over the ceiling: prefill's scale-up yields first.
    for role in (PlannerRole.PREFILL, PlannerRole.DECODE):
        p = by_role.get(role)
        if total > config.max_gpu_budget and p is not None and p.desired > p.current:
            drop(role)
    # Under the floor: decode's scale-down yields first.
    for role in (PlannerRole.DECODE, PlannerRole.PREFILL):
        p = by_role.get(role)
        if total < config.min_gpu_budget and p is not None and p.desired < p.current:
            drop(role)
    return [by_role[p.role] for p in proposed]
