"""The rescheduler's decision settings, as the decision core takes them (pure data; the
proxy's settings validate the values and build one of these)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class SelectRule(StrEnum):
    NUM_REQ = "NUM_REQ"  # move `value` requests
    TOKEN = "TOKEN"  # move requests holding up to `value` tokens
    RATIO = "RATIO"  # move requests holding up to `value` of the source's KV cache (0..1)


class SelectOrder(StrEnum):
    LCR = "LCR"  # last come, running
    FCR = "FCR"  # first come, running
    LR = "LR"  # longest running (sequence length)
    SR = "SR"  # shortest running
    FCW = "FCW"  # first come, waiting
    FCWSR = "FCWSR"  # first come waiting; if none, shortest running


class FailoverDomain(StrEnum):
    INSTANCE = "instance"
    NODE = "node"
    INSTANCE_UNIT = "instance-unit"
    NODE_UNIT = "node-unit"


class Scope(StrEnum):
    CLUSTER = "cluster"
    UNIT = "unit"


POLICIES: tuple[str, ...] = (
    "decode_load",
    "neutral_load",
    "prefill_failover",
    "decode_failover",
    "neutral_failover",
    "binpacking_mitigation",
    "binpacking_consolidation",
)

LOAD_METRICS: tuple[str, ...] = (
    "kv_cache_usage_ratio_projected",
    "kv_cache_usage_ratio",
    "num_requests",
    "num_waiting_requests",
    "decode_batch_size",
)


@dataclass(frozen=True, slots=True)
class ReschedulerConfig:
    policies: tuple[str, ...] = (
        "decode_load",
        "prefill_failover",
        "decode_failover",
        "neutral_failover",
    )
    decode_load_metric: str = "kv_cache_usage_ratio_projected"
    decode_load_threshold: float = 1.0
    neutral_load_metric: str = "kv_cache_usage_ratio_projected"
    neutral_load_threshold: float = 1.0
    load_balance_threshold: float = 0.0  # least source-minus-target load difference to move
    load_balance_scope: Scope = Scope.CLUSTER
    failover_domain: FailoverDomain = FailoverDomain.INSTANCE
    instance_staleness_s: float = 60.0
    req_select_rule: SelectRule = SelectRule.TOKEN
    req_select_order: SelectOrder = SelectOrder.SR
    req_select_value: float = 1024.0
    tpot_slo_s: float = 0.050
    tpot_dispatch_threshold: float = 0.85
    tpot_migrate_out_ceil_threshold: float = 0.95
    tpot_migrate_out_floor_threshold: float = 0.60
