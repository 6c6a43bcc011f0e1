"""A scheduling profile: filters in order, weighted scorers summed, one picker."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from fleet.types import Backend
from policies.framework import Filter, Picker, SchedulingRequest, Scorer


@dataclass(frozen=True, slots=True)
class WeightedScorer:
    scorer: Scorer
    weight: float


class Profile:
    def __init__(
        self,
        name: str,
        filters: Sequence[Filter],
        scorers: Sequence[WeightedScorer],
        picker: Picker,
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker

    def run(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> Backend | None:
        """The chosen backend, or None when the filters left nothing."""
        timer = req.timer
        for f in self.filters:
            t0 = time.perf_counter() if timer else 0.0
            candidates = f.filter(req, candidates)
            if timer:
                timer("filter", f.type, f.name, time.perf_counter() - t0)
            if not candidates:
                req.reasons.append(f"{self.name}: {f.name} left no candidate")
                return None
        totals = [0.0] * len(candidates)
        for ws in self.scorers:
            t0 = time.perf_counter() if timer else 0.0
            scores = ws.scorer.score(req, candidates)
            if timer:
                timer("scorer", ws.scorer.type, ws.scorer.name, time.perf_counter() - t0)
            w = ws.weight
            totals = [t + w * s for t, s in zip(totals, scores, strict=True)]
            if req.explain:
                for b, s in zip(candidates, scores, strict=True):
                    req.note(b.id, ws.scorer.name, s)
        if req.explain and self.scorers:
            for b, total in zip(candidates, totals, strict=True):
                req.note(b.id, f"{self.name}.total", total)
        t0 = time.perf_counter() if timer else 0.0
        chosen = self.picker.pick(req, candidates, totals)
        if timer:
            timer("picker", self.picker.type, self.picker.name, time.perf_counter() - t0)
        return chosen
