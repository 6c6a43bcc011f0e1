"""The two baseline policies every router has."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.base import Decision, RequestContext


class RoundRobin:
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = 0

    def pick(self, ctx: RequestContext, candidates: Sequence[Backend], now: float) -> Decision:
        target = candidates[self._counter % len(candidates)]
        self._counter += 1
        return Decision(target=target, reason="round_robin")


class LeastRequests:
    """Fewest requests in flight through this proxy; ties go round-robin so cold starts spread."""

    name = "least_requests"

    def __init__(self) -> None:
        self._counter = 0

    def pick(self, ctx: RequestContext, candidates: Sequence[Backend], now: float) -> Decision:
        n = len(candidates)
        start = self._counter % n
        self._counter += 1
        best = candidates[start]
        best_load = best.load.in_flight
        for i in range(1, n):
            b = candidates[(start + i) % n]
            if b.load.in_flight < best_load:
                best, best_load = b, b.load.in_flight
        decision = Decision(target=best, reason="least_requests")
        if ctx.debug:
            decision.scores = {b.id: {"in_flight": float(b.load.in_flight)} for b in candidates}
        return decision
