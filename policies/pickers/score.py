"""Pickers that use the profile's weighted scores."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.framework import SchedulingRequest, SeededPlugin


class MaxScorePicker(SeededPlugin):
    """The highest total; ties are broken at random (as the EPP does) so they spread."""

    type = "max-score-picker"

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        best = max(totals)
        tied = [i for i, t in enumerate(totals) if t >= best - 1e-12]
        i = tied[0] if len(tied) == 1 else self._rng.choice(tied)
        return candidates[i]


class RandomPicker(SeededPlugin):
    type = "random-picker"

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        return candidates[self._rng.randrange(len(candidates))]


class WeightedRandomPicker(SeededPlugin):
    """Lottery scheduling: the chance of a backend is its total over the sum of totals."""

    type = "weighted-random-picker"

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        weights = [max(0.0, t) for t in totals]
        if sum(weights) <= 0.0:
            return candidates[self._rng.randrange(len(candidates))]
        return self._rng.choices(candidates, weights=weights)[0]
