"""Prefix-cache scorer: the share of the prompt's blocks the backend is believed to hold."""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest


class PrefixCacheScorer(PluginBase):
    """score = leading matched blocks / total blocks (llm-d's approximate prefix scorer)."""

    type = "prefix-cache-scorer"

    def __init__(self, services: RoutingServices, name: str = "") -> None:
        super().__init__(name)
        services.use_prefix_index()

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        match = req.prefix()
        if not match.matched:
            return [0.0] * len(candidates)
        matched, total = match.matched, match.total_blocks
        return [matched.get(b.spec.id, 0) / total for b in candidates]
