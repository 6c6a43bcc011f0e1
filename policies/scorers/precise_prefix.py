"""Precise prefix-cache scorer: the share of the prompt's blocks a backend really holds, by
its own KV-cache events (fleet/precise_prefix.py).

score = leading blocks held / the prompt's full blocks (in the backend's block size). For a
backend the precise index does not stand for (it publishes no events, or its index is being
rebuilt), and for a request whose token ids could not be had, the approximate prefix index's
score for that backend instead, so a mixed fleet is still scored on one scale.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest


class PrecisePrefixCacheScorer(PluginBase):
    type = "precise-prefix-cache-scorer"

    def __init__(self, services: RoutingServices, name: str = "") -> None:
        super().__init__(name)
        services.use_prefix_index()  # the fallback; also recorded on every decision
        services.use_precise_index()

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        approximate = req.prefix()
        precise = req.precise()
        scores: list[float] = []
        for b in candidates:
            bid = b.spec.id
            exact = req.is_precise(bid)
            score = precise.ratio(bid) if exact else approximate.ratio(bid)
            if req.explain:  # which index the score came from
                req.note(bid, "from_events", 1.0 if exact else 0.0)
            scores.append(score)
        return scores
