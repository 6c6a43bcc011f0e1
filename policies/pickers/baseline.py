"""Load-balancing pickers that ignore scores: round-robin, least-requests, power-of-two."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.framework import PluginBase, SchedulingRequest, SeededPlugin
from policies.loads import in_flight
from policies.pickers.rotation import Rotation


class RoundRobinPicker(PluginBase):
    type = "round-robin-picker"

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._rotation = Rotation()

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        return candidates[self._rotation.start(len(candidates))]


def least_in_flight(candidates: Sequence[Backend], start: int) -> Backend:
    """Fewest requests in flight through this proxy (all its workers: `loads.in_flight`,
    written out here because this loop is the default policy's whole decision); ties go to
    the first from `start`."""
    n = len(candidates)
    best = candidates[start]
    load = best.load
    best_load = load.in_flight + load.peer_in_flight
    for k in range(1, n):
        b = candidates[(start + k) % n]
        load = b.load
        if load.in_flight + load.peer_in_flight < best_load:
            best, best_load = b, load.in_flight + load.peer_in_flight
    return best


class LeastRequestsPicker(PluginBase):
    type = "least-requests-picker"

    def __init__(self, name: str = "") -> None:
        super().__init__(name)
        self._rotation = Rotation()

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        if req.explain:
            for b in candidates:
                req.note(b.id, "in_flight", in_flight(b))
        return least_in_flight(candidates, self._rotation.start(len(candidates)))


class PowerOfTwoPicker(SeededPlugin):
    """Two random candidates, the one with fewer requests in flight (first sampled on a tie)."""

    type = "power-of-two-picker"

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i, j = self._rng.sample(range(n), 2)
        a, b = candidates[i], candidates[j]
        if req.explain:
            req.note(a.id, "in_flight", in_flight(a))
            req.note(b.id, "in_flight", in_flight(b))
        return b if in_flight(b) < in_flight(a) else a
