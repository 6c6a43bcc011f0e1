"""The hybrid "unified" policy (the LMetric authors' algorithm): LMetric + affinity.

1. Affinity gate, for a request with a session: its owner is the session's rendezvous home
   among the candidates (policies/rendezvous.py), the same backend in every worker and every
   replica with nothing shared. The request goes home unless the home is overloaded: its
   num_requests > average num_requests x `overload_factor` (2.0).
2. Otherwise LMetric with its tie-breakers (uncached tokens, num_requests, rotation).

The gate no longer asks for cache_ratio > `cache_ratio_threshold` on the owner: a home passed
over for lacking the cache never gets it (docs/policies.md has the measurement). The
threshold now only tells a warm home (`affinity_hits`) from a cold one (`cold_homes`).

An edge case the gate-then-LMetric rule leaves open: with cache_ratio = 1.0 on an overloaded
home, the gate fails but the home has 0 uncached tokens, so LMetric re-elects it (its
P_tokens x BS is 0 when it has no pending prefill, and it wins the uncached-tokens
tie-breaker). Settled with a hard
ceiling: in step 2 a backend whose num_requests exceeds average x `ceiling_factor` is not
eligible while some backend is under the ceiling. `ceiling_factor: null` turns it off and
gives that rule exactly. num_requests is `policies.loads.batch_size`.

No session memory. A turn sent away from an overloaded home is followed home by the next one
as soon as the home is under the factor, in every process alike; until then the process that
sent it away finds its blocks through its prefix index (LMetric's uncached tokens). A
per-process note of where a session went would keep only that process's turns there,
splitting the session between two backends again.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.loads import batch_size
from policies.pickers.lmetric import lmetric_argmin
from policies.pickers.rotation import Rotation
from policies.rendezvous import home as rendezvous_home


class UnifiedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_ratio_threshold: float = Field(0.5, ge=0.0, le=1.0)
    overload_factor: float = Field(2.0, gt=0.0)
    ceiling_factor: float | None = Field(2.0, gt=0.0)


class UnifiedPicker(PluginBase):
    type = "unified-picker"

    def __init__(self, params: UnifiedParams, services: RoutingServices, name: str = "") -> None:
        super().__init__(name)
        services.use_prefix_index()
        self.params = params
        self._rotation = Rotation()
        self.affinity_hits = 0
        self.cold_homes = 0
        self.gate_load_failures = 0
        self.ceiling_exclusions = 0

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        p = self.params
        n = len(candidates)
        avg = sum(batch_size(b) for b in candidates) / n
        sid = req.ctx.session_id
        if sid is not None:
            home = rendezvous_home(sid, candidates)
            if req.explain:
                req.note(home.id, "home", 1.0)
                req.note(home.id, "avg_num_requests", avg)
            if batch_size(home) > avg * p.overload_factor:
                self.gate_load_failures += 1
            else:
                ratio = req.cache_ratio(home.id)
                if req.explain:
                    req.note(home.id, "cache_ratio", ratio)
                if ratio > p.cache_ratio_threshold:
                    self.affinity_hits += 1
                    req.reasons.append("unified: affinity")
                else:
                    self.cold_homes += 1
                    req.reasons.append("unified: affinity, home cold")
                return home
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
            "affinity_hits": self.affinity_hits,
            "cold_homes": self.cold_homes,
            "gate_load_failures": self.gate_load_failures,
            "ceiling_exclusions": self.ceiling_exclusions,
        }
