"""Prefix-cache affinity filter with a TTFT load gate.

Narrows the candidates to the "sticky" backends whose prefix-cache score reaches
`threshold`, unless
- with probability `explore_probability` (exploration keeps the index learning), or
- the TTFT load gate trips: the best sticky backend's estimated prefill work ahead of this
  request's first token exceeds the best other backend's by `gate_ratio` x plus
  `gate_slack_tokens`. The estimate, in tokens, is pending prefill tokens (proxy accounting)
  plus this request's uncached tokens there: a TTFT proxy that needs no latency model.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.loads import pending_prefill_tokens


class PrefixAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold: float = Field(0.5, gt=0.0, le=1.0)
    explore_probability: float = Field(0.0, ge=0.0, le=1.0)
    gate_ratio: float = Field(2.0, ge=1.0)
    gate_slack_tokens: int = Field(1024, ge=0)
    seed: int | None = None


class PrefixCacheAffinityFilter(PluginBase):
    type = "prefix-cache-affinity-filter"

    def __init__(
        self, params: PrefixAffinityParams, services: RoutingServices, name: str = ""
    ) -> None:
        super().__init__(name)
        services.use_prefix_index()
        self.params = params
        self._rng = random.Random(params.seed)
        self.gate_trips = 0

    def filter(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> Sequence[Backend]:
        p = self.params
        match = req.prefix()
        if match.total_blocks == 0:
            return candidates
        # Only backends holding part of the prompt can be sticky: look at those alone.
        need = p.threshold * match.total_blocks
        sticky_ids = {bid for bid, blocks in match.matched.items() if blocks >= need}
        if not sticky_ids:
            return candidates
        sticky = [b for b in candidates if b.spec.id in sticky_ids]
        if not sticky or len(sticky) == len(candidates):
            return candidates
        if p.explore_probability and self._rng.random() < p.explore_probability:
            return candidates
        uncached = req.uncached_by_backend()
        everything = req.ctx.prompt_tokens
        best_sticky = min(pending_prefill_tokens(b) + uncached[b.spec.id] for b in sticky)
        best_other = min(
            pending_prefill_tokens(b) + uncached.get(b.spec.id, everything)
            for b in candidates
            if b.spec.id not in sticky_ids
        )
        if best_sticky > best_other * p.gate_ratio + p.gate_slack_tokens:
            self.gate_trips += 1
            req.reasons.append(f"{self.name}: TTFT load gate broke stickiness")
            return candidates
        return sticky

    def stats(self) -> dict[str, int]:
        return {"gate_trips": self.gate_trips}
