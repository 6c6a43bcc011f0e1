"""The hybrid "unified" policy (the LMetric authors' algorithm): LMetric + high-cache affinity.

1. Affinity gate, for a request with a session: its owner is the session's rendezvous home
   among the candidates (policies/rendezvous.py), the same backend in every worker and every
   replica with nothing shared. The request goes home unless
   - the prompt is cached elsewhere: cache_ratio = cached prompt share on the home <=
     `cache_ratio_threshold` (0.5) while another candidate holds more than that share; or
   - the home is overloaded: its num_requests > average num_requests x `overload_factor` (2.0).
   A session cached nowhere (its first turn, or evicted everywhere) goes home too: that is
   where every process will look for its next turns.
2. Otherwise LMetric with its tie-breakers (uncached tokens, num_requests, rotation).

An edge case the gate-then-LMetric rule leaves open: with cache_ratio = 1.0 on an overloaded
home, the gate fails but the home has 0 uncached tokens, so LMetric re-elects it (its
P_tokens x BS is 0 when it has no pending prefill, and it wins the uncached-tokens
tie-breaker). Settled with a hard
ceiling: in step 2 a backend whose num_requests exceeds average x `ceiling_factor` is not
eligible while some backend is under the ceiling. `ceiling_factor: null` turns it off and
gives that rule exactly. num_requests is `Backend.batch_size`.

No session memory of its own. A turn that left an overloaded home is followed by the next one
going home again as soon as the home is under the factor, in every process alike; while it
stays overloaded, the process that sent the turn away finds its blocks through the prefix
index (LMetric's uncached tokens). A per-process note of where a session went would keep only
that process's turns there, splitting the session between two backends again. What still
differs between processes is the prefix index (and each one's health view): see
docs/policies.md.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.loads import batch_size
from policies.pickers.lmetric import lmetric_argmin
from policies.pickers.rotation import Rotation
from policies.plugin import RoutingServices, SchedulingRequest
from policies.plugin_base import PluginBase
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
        self.gate_ratio_failures = 0
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
            ratio = req.cache_ratio(home.id)
            if req.explain:
                req.note(home.id, "home", 1.0)
                req.note(home.id, "cache_ratio", ratio)
                req.note(home.id, "avg_num_requests", avg)
            cold = ratio <= p.cache_ratio_threshold
            if cold and self._cached_elsewhere(req, candidates, home):
                self.gate_ratio_failures += 1
            elif batch_size(home) > avg * p.overload_factor:
                self.gate_load_failures += 1
            elif cold:
                self.cold_homes += 1
                req.reasons.append("unified: home, cached nowhere")
                return home
            else:
                self.affinity_hits += 1
                req.reasons.append("unified: affinity")
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

    def _cached_elsewhere(
        self, req: SchedulingRequest, candidates: Sequence[Backend], home: Backend
    ) -> bool:
        """Some candidate other than the home holds more than the threshold's share."""
        threshold = self.params.cache_ratio_threshold
        match = req.prefix()
        n = req.text_bytes()
        if n == 0 or min(1.0, match.best_blocks * match.chars_per_block / n) <= threshold:
            return False  # the usual case, with no loop: nobody holds that much
        return any(b is not home and req.cache_ratio(b.spec.id) > threshold for b in candidates)

    def stats(self) -> dict[str, int]:
        return {
            "affinity_hits": self.affinity_hits,
            "cold_homes": self.cold_homes,
            "gate_ratio_failures": self.gate_ratio_failures,
            "gate_load_failures": self.gate_load_failures,
            "ceiling_exclusions": self.ceiling_exclusions,
        }
