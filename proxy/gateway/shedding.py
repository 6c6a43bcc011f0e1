"""When the gateway refuses a sheddable request (429) instead of queueing it on an engine: the
Gateway API Inference Extension's rule, with its default thresholds. A request is sheddable
when its objective's priority is negative; the pool is saturated when no engine has room, an
engine having room while its queue and its KV cache are both under their thresholds."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from fleet.types import Backend
from proxy.gateway.objectives import FixedPriorities, ObjectivePriorities

# The request header that names its objective (an InferenceObjective's name).
OBJECTIVE_HEADER = "x-gateway-inference-objective"


@dataclass(frozen=True, slots=True)
class Shedding:
    queue_depth: float = 5.0  # waiting requests at which an engine has no room
    kv_cache: float = 0.8  # KV-cache usage (0..1) at which an engine has no room
    # Each objective's priority; an objective not named has priority 0 (never shed).
    priorities: ObjectivePriorities = field(default_factory=FixedPriorities)

    def sheddable(self, headers: Mapping[str, str]) -> bool:
        objective = headers.get(OBJECTIVE_HEADER)
        if objective is None:
            return False
        priority = self.priorities.priority(objective)
        return priority is not None and priority < 0

    def saturated(self, backends: Iterable[Backend]) -> bool:
        """No engine has room by its latest scrape (one never scraped has none)."""
        for b in backends:
            snap = b.snapshot
            if snap is None:
                continue
            m = snap.metrics
            if m.waiting < self.queue_depth and m.kv_usage < self.kv_cache:
                return False
        return True
