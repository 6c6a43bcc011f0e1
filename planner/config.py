"""The planner's settings (pure data) and their validation.

Defaults are those of Dynamo's load-based planner. Intervals are seconds, except the two
grace rules, which count adjustment intervals. GPU budgets count GPUs over both roles:
`prefill replicas * prefill_engine_num_gpu + decode replicas * decode_engine_num_gpu`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Topology(StrEnum):
    DISAGGREGATED = "disaggregated"  # prefill workers and decode workers, planned apart
    AGGREGATED = "aggregated"  # one pool of workers that prefill and decode: one role only


class PlannerMode(StrEnum):
    LOAD = "load"  # thresholds on the queue and KV utilisation (planner/decide.py)
    SLA = "sla"  # replicas from predicted traffic and profiled latencies (planner/sla_decide.py)


class PredictorKind(StrEnum):
    CONSTANT = "constant"  # the last interval's value
    MOVING_AVERAGE = "moving_average"  # the mean of the last `load_predictor_window`
    KALMAN = "kalman"  # a local-linear-trend state-space model (planner/predictors.py)


class PlannerRole(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"  # decode workers, or the aggregated workers of an aggregated fleet


@dataclass(frozen=True, slots=True)
class PlannerConfig:
    metric_pulling_interval: float = 1.0
    adjustment_interval: float = 30.0
    decode_kv_scale_up_threshold: float = 0.9
    decode_kv_scale_down_threshold: float = 0.5
    prefill_queue_scale_up_threshold: float = 0.5
    prefill_queue_scale_down_threshold: float = 0.2
    max_gpu_budget: int = 8
    min_gpu_budget: int = 1
    prefill_engine_num_gpu: int = 1
    decode_engine_num_gpu: int = 1
    no_operation: bool = False
    # Adjustments after a decode worker is added at which decode is not scaled down: the new
    # worker's KV cache is still filling, so the mean utilisation reads low.
    new_decode_worker_grace_period: int = 3
    # Adjustment intervals ahead over which the prefill queue's trend is extrapolated before
    # a prefill worker is added.
    new_prefill_worker_queue_buffer_period: int = 3
    topology: Topology = Topology.DISAGGREGATED
    # A role with no worker cannot serve at all, so neither role goes under one worker;
    # None: no cap beyond the GPU budget.
    min_prefill_replicas: int = 1
    max_prefill_replicas: int | None = None
    min_decode_replicas: int = 1
    max_decode_replicas: int | None = None
    # SLA mode: targets in seconds, the profile file `fleet-proxy profile-sla` writes, and how
    # the next interval's request rate, ISL and OSL are predicted.
    mode: PlannerMode = PlannerMode.LOAD
    ttft_target: float | None = None
    itl_target: float | None = None
    sla_profile: str | None = None
    load_predictor: PredictorKind = PredictorKind.CONSTANT
    load_predictor_window: int = 10  # intervals the predictor reads (moving average, model fit)

    @property
    def roles(self) -> tuple[PlannerRole, ...]:
        """The roles this fleet plans, in the order decisions list them."""
        if self.topology is Topology.AGGREGATED:
            return (PlannerRole.DECODE,)
        return (PlannerRole.PREFILL, PlannerRole.DECODE)

    def engine_gpus(self, role: PlannerRole) -> int:
        if role is PlannerRole.PREFILL:
            return self.prefill_engine_num_gpu
        return self.decode_engine_num_gpu

    def replica_bounds(self, role: PlannerRole) -> tuple[int, int | None]:
        if role is PlannerRole.PREFILL:
            return self.min_prefill_replicas, self.max_prefill_replicas
        return self.min_decode_replicas, self.max_decode_replicas


def check_config(config: PlannerConfig) -> None:
    """ValueError naming every setting that is out of range (all of them, not the first)."""
    c = config
    errors: list[str] = []

    def need(ok: bool, message: str) -> None:
        if not ok:
            errors.append(message)

    need(c.metric_pulling_interval > 0, "metric_pulling_interval must be > 0 seconds")
    need(
        c.adjustment_interval >= c.metric_pulling_interval,
        "adjustment_interval must be >= metric_pulling_interval (an interval needs a sample)",
    )
    for name, low, high in (
        ("decode_kv", c.decode_kv_scale_down_threshold, c.decode_kv_scale_up_threshold),
        ("prefill_queue", c.prefill_queue_scale_down_threshold, c.prefill_queue_scale_up_threshold),
    ):
        need(low >= 0, f"{name}_scale_down_threshold must be >= 0")
        need(
            low < high,
            f"{name}_scale_down_threshold ({low}) must be below "
            f"{name}_scale_up_threshold ({high}), or the planner would oscillate",
        )
    need(c.decode_kv_scale_up_threshold <= 1, "decode_kv_scale_up_threshold must be <= 1")
    need(c.prefill_engine_num_gpu >= 1, "prefill_engine_num_gpu must be >= 1")
    need(c.decode_engine_num_gpu >= 1, "decode_engine_num_gpu must be >= 1")
    need(c.min_gpu_budget >= 0, "min_gpu_budget must be >= 0")
    need(
        c.max_gpu_budget >= c.min_gpu_budget,
        f"max_gpu_budget ({c.max_gpu_budget}) must be >= min_gpu_budget ({c.min_gpu_budget})",
    )
    need(c.new_decode_worker_grace_period >= 0, "new_decode_worker_grace_period must be >= 0")
    need(
        c.new_prefill_worker_queue_buffer_period >= 0,
        "new_prefill_worker_queue_buffer_period must be >= 0",
    )
    need(c.load_predictor_window >= 1, "load_predictor_window must be >= 1")
    if c.mode is PlannerMode.SLA:
        for name, target in (("ttft_target", c.ttft_target), ("itl_target", c.itl_target)):
            need(target is not None and target > 0, f"sla mode needs {name} > 0 seconds")
        need(bool(c.sla_profile), "sla mode needs sla_profile (the profile-sla file)")
    floor_gpus = 0
    for role in c.roles:
        least, most = c.replica_bounds(role)
        need(least >= 1, f"min_{role}_replicas must be >= 1")
        need(
            most is None or most >= least,
            f"max_{role}_replicas ({most}) must be >= min_{role}_replicas ({least})",
        )
        floor_gpus += least * c.engine_gpus(role)
    need(
        floor_gpus <= c.max_gpu_budget,
        f"the minimum replicas need {floor_gpus} GPUs, over max_gpu_budget ({c.max_gpu_budget})",
    )
    if errors:
        raise ValueError("invalid planner config: " + "; ".join(errors))
