"""Scripted metric histories for the planner's tests: one sample a second."""

from __future__ import annotations

from typing import Any

from planner.config import PlannerConfig, Topology
from planner.decide import PlannerState
from planner.observe import Sample

INTERVAL = 30.0
CFG = PlannerConfig()
AGG = PlannerConfig(topology=Topology.AGGREGATED)


def history(
    queue: float | list[float] | None,
    kv: float | list[float] | None,
    start: float = 0.0,
    seconds: int = 30,
) -> list[Sample]:
    """Samples at start+1 .. start+seconds; a list gives one value per sample."""

    def at(v: float | list[float] | None, i: int) -> float | None:
        return v[i] if isinstance(v, list) else v

    return [
        Sample(start + i + 1, at(queue, i), at(kv, i), prefill_replicas=1, decode_replicas=1)
        for i in range(seconds)
    ]


def state(prefill: int = 2, decode: int = 2, last: float = 0.0, **kw: Any) -> PlannerState:
    return PlannerState(prefill, decode, last_adjustment_at=last, **kw)
