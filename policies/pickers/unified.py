"""The hybrid "unified" policy (the LMetric authors' algorithm): LMetric + high-cache affinity.

1. Affinity gate, for a session with a recorded owner among the candidates: route to the
   owner when cache_ratio = cached prompt share on the owner > `cache_ratio_threshold` (0.5)
   AND owner.num_requests <= average num_requests x `overload_factor` (2.0).
2. Otherwise LMetric with its tie-breakers (uncached tokens, num_requests, rotation).

An edge case the gate-then-LMetric rule leaves open: with cache_ratio = 1.0 on an overloaded
owner, gate 2 fails but the owner has 0 uncached tokens, so LMetric re-elects it (its
P_tokens x BS is 0 when it has no pending prefill, and it wins the uncached-tokens
tie-breaker). Settled with a hard
ceiling: in step 2 a backend whose num_requests exceeds average x `ceiling_factor` is not
eligible while some backend is under the ceiling. `ceiling_factor: null` turns it off and
gives that rule exactly. num_requests is `Backend.batch_size`.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.loads import batch_size
from policies.pickers.lmetric import lmetric_argmin
from policies.pickers.rotation import Rotation
from policies.plugin import RoutingServices, SchedulingRequest
from policies.sessions import SessionOwnerPlugin


class UnifiedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_ratio_threshold: float = Field(0.5, ge=0.0, le=1.0)
    overload_factor: float = Field(2.0, gt=0.0)
    ceiling_factor: float | None = Field(2.0, gt=0.0)
    max_sessions: int = Field(100_000, ge=1)


class UnifiedPicker(SessionOwnerPlugin):
    type = "unified-picker"

    def __init__(self, params: UnifiedParams, services: RoutingServices, name: str = "") -> None:
        super().__init__(params.max_sessions, name)
        services.use_prefix_index()
        self.params = params
        self._rotation = Rotation()
        self.affinity_hits = 0
        self.gate_ratio_failures = 0
        self.gate_load_failures = 0
        self.ceiling_exclusions = 0

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        p = self.params
        n = len(candidates)
        avg = sum(batch_size(b) for b in candidates) / n
        owner_id = self.owner(req)
        owner = next((b for b in candidates if b.spec.id == owner_id), None) if owner_id else None
        if owner is not None:
            ratio = req.cache_ratio(owner.id)
            if req.explain:
                req.note(owner.id, "cache_ratio", ratio)
                req.note(owner.id, "avg_num_requests", avg)
            if ratio <= p.cache_ratio_threshold:
                self.gate_ratio_failures += 1
            elif batch_size(owner) > avg * p.overload_factor:
                self.gate_load_failures += 1
            else:
                self.affinity_hits += 1
                req.reasons.append("unified: affinity")
                return owner
        pool = candidates
        if p.ceiling_factor is not None:
            limit = avg * p.ceiling_factor
            under = [b for b in candidates if batch_size(b) <= limit]
            if under and len(under) < n:
                self.ceiling_exclusions += 1
                pool = under
        req.reasons.append("unified: lmetric")
        return lmetric_argmin(req, pool, self._rotation.start(len(pool)))

    def stats(self) -> dict[str, int]:
        return {
            "sessions": len(self.sessions),
            "affinity_hits": self.affinity_hits,
            "gate_ratio_failures": self.gate_ratio_failures,
            "gate_load_failures": self.gate_load_failures,
            "ceiling_exclusions": self.ceiling_exclusions,
        }
