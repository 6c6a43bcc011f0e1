"""SLO headroom tier filter: keeps the candidates predicted to miss the fewest of the
request's objectives (tier 0: meets every objective it carries; 1: meets one of two; 2:
meets none), with the latency scorer's predictor. A request without `x-slo-ttft-ms` or
`x-slo-tpot-ms` passes every candidate through.

With probability `explore_probability` (when tiers differ) it keeps the worse tiers instead,
so that engines predicted to miss still get an occasional request and fresh observations.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from fleet.types import Backend
from policies.framework import PluginBase, SchedulingRequest
from policies.headroom import misses
from policies.predicted import LatencyModelParams, predictions, request_slo


class SloTierParams(LatencyModelParams):
    explore_probability: float = Field(0.0, ge=0.0, le=1.0)
    seed: int | None = None


class SloHeadroomTierFilter(PluginBase):
    type = "slo-headroom-tier-filter"

    def __init__(self, params: SloTierParams, name: str = "") -> None:
        super().__init__(name)
        self.params = params
        self.model = params.latency_model()
        self._rng = random.Random(params.seed)
        self.kept_tiers: dict[int, int] = {}  # best tier kept -> requests
        self.explorations = 0

    def filter(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> Sequence[Backend]:
        slo = request_slo(req)
        if not slo:
            return candidates
        tiers = [misses(p, slo) for p in predictions(req, candidates, self.model)]
        best = min(tiers)
        self.kept_tiers[best] = self.kept_tiers.get(best, 0) + 1
        explore = self.params.explore_probability
        if explore and max(tiers) > best and self._rng.random() < explore:
            self.explorations += 1
            req.reasons.append(f"{self.name}: explored tiers worse than {best}")
            return [b for b, t in zip(candidates, tiers, strict=True) if t > best]
        return [b for b, t in zip(candidates, tiers, strict=True) if t == best]

    def stats(self) -> dict[str, int]:
        out = {f"tier_{t}": n for t, n in sorted(self.kept_tiers.items())}
        out["explorations"] = self.explorations
        return out
