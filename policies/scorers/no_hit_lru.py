"""No-hit-LRU: spread cold (zero prefix hit) requests over the fleet.

For a cold request, backends that never took a cold request score 1.0, then the ones used
least recently score higher than the ones used recently. A request with a prefix hit anywhere
gets 0.5 everywhere, which leaves the other scorers to decide.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.policy import Decision


class NoHitLruParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lru_size: int | None = Field(None, ge=1)  # backends remembered; None: every backend


class NoHitLruScorer(PluginBase):
    type = "no-hit-lru-scorer"

    def __init__(
        self, services: RoutingServices, name: str = "", lru_size: int | None = None
    ) -> None:
        super().__init__(name)
        services.use_prefix_index()
        # backend -> sequence number of its last cold pick, least recent first
        self._last_cold: dict[str, int] = {}
        self._seq = 0
        self._lru_size = lru_size

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        if req.prefix().best_blocks > 0:
            return [0.5] * len(candidates)
        used = sorted(
            (self._last_cold[b.id], i) for i, b in enumerate(candidates) if b.id in self._last_cold
        )
        scores = [1.0] * len(candidates)
        k = len(used)
        for rank, (_, i) in enumerate(used):  # rank 0 = least recently used
            scores[i] = (k - rank) / (k + 1)
        return scores

    def on_picked(self, req: SchedulingRequest, decision: Decision) -> None:
        if req.prefix().best_blocks == 0:
            self._seq += 1
            last = self._last_cold
            last.pop(decision.target.id, None)
            last[decision.target.id] = self._seq
            if self._lru_size is not None and len(last) > self._lru_size:
                del last[next(iter(last))]  # forgotten: scores as never used

    def on_backend_removed(self, backend_id: str) -> None:
        self._last_cold.pop(backend_id, None)
