"""Autellix load balancer (the Autellix paper's Algorithm 2).

- At most `threshold_tokens` (2048) prefill tokens: LEAST_USED, the backend with the fewest
  requests in flight (ties rotate).
- Above: the program's backend from the program table `pt`; on first sight (or when its
  backend is gone) LEAST_USED, recorded in `pt`.

The program is the `x-program-id` header, else the session id; a large request with neither
is balanced like a small one. Programs leave the table by `end_program` (admin call), after
`idle_ttl_s` without a request, or by LRU past `max_programs`. A removed backend's programs
are reassigned on their next request. Workload is the proxy's in-flight count, so Algorithm 2's
`complete_request` is the proxy's own accounting and needs no hook here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.loads import in_flight
from policies.pickers.baseline import least_in_flight
from policies.pickers.rotation import Rotation
from policies.plugin import SchedulingRequest
from policies.plugin_base import PluginBase


class AutellixParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold_tokens: int = Field(2048, ge=0)
    idle_ttl_s: float | None = Field(600.0, gt=0.0)
    max_programs: int = Field(100_000, ge=1)


@dataclass(slots=True)
class _Assignment:
    backend_id: str
    last_seen: float


class AutellixPicker(PluginBase):
    type = "autellix-picker"

    def __init__(self, params: AutellixParams, name: str = "") -> None:
        super().__init__(name)
        self.params = params
        self._table: OrderedDict[str, _Assignment] = OrderedDict()  # oldest last_seen first
        self._rotation = Rotation()
        self._engines: Sequence[Backend] = ()  # the last candidates, for stats
        self._removed: set[str] = set()  # removed since the last request
        self.total_requests = 0
        self.small_requests = 0
        self.large_requests = 0
        self.locality_hits = 0
        self.locality_assigns = 0
        self.reassignments = 0
        self.expired_programs = 0
        self.ended_programs = 0

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        self._expire(req.now)
        self._engines = candidates
        self._removed.clear()
        self.total_requests += 1
        tokens = req.ctx.prompt_tokens
        pid = req.ctx.program_id or req.ctx.session_id
        if tokens <= self.params.threshold_tokens or pid is None:
            self.small_requests += 1
            req.reasons.append("autellix: small -> least used")
            return self._least_used(candidates)
        self.large_requests += 1
        entry = self._table.get(pid)
        if entry is not None:
            owner = next((b for b in candidates if b.spec.id == entry.backend_id), None)
            if owner is not None:
                self.locality_hits += 1
                entry.last_seen = req.now
                self._table.move_to_end(pid)
                req.reasons.append("autellix: large -> program's engine")
                return owner
            self.reassignments += 1  # its engine left the fleet or stopped serving
        chosen = self._least_used(candidates)
        self.locality_assigns += 1
        self._table[pid] = _Assignment(chosen.id, req.now)
        self._table.move_to_end(pid)
        while len(self._table) > self.params.max_programs:
            self._table.popitem(last=False)
        req.reasons.append("autellix: large -> assigned least used")
        return chosen

    def _least_used(self, candidates: Sequence[Backend]) -> Backend:
        return least_in_flight(candidates, self._rotation.start(len(candidates)))

    def _expire(self, now: float) -> None:
        ttl = self.params.idle_ttl_s
        if ttl is None:
            return
        while self._table:
            pid, entry = next(iter(self._table.items()))
            if now - entry.last_seen <= ttl:
                break
            del self._table[pid]
            self.expired_programs += 1

    def program_engine(self, program_id: str) -> str | None:
        entry = self._table.get(program_id)
        return None if entry is None else entry.backend_id

    def end_program(self, program_id: str) -> bool:
        if self._table.pop(program_id, None) is None:
            return False
        self.ended_programs += 1
        return True

    def on_backend_removed(self, backend_id: str) -> None:
        # Its programs stay in the table without an engine; their next request reassigns them.
        self._removed.add(backend_id)
        for entry in self._table.values():
            if entry.backend_id == backend_id:
                entry.backend_id = ""

    def stats(self) -> dict[str, Any]:
        per_engine: dict[str, int] = {}
        for entry in self._table.values():
            if entry.backend_id:
                per_engine[entry.backend_id] = per_engine.get(entry.backend_id, 0) + 1
        return {
            "total_requests": self.total_requests,
            "small_requests": self.small_requests,
            "large_requests": self.large_requests,
            "locality_hits": self.locality_hits,
            "locality_assigns": self.locality_assigns,
            "reassignments": self.reassignments,
            "expired_programs": self.expired_programs,
            "ended_programs": self.ended_programs,
            "programs_in_table": len(self._table),
            "engines": {
                b.id: {
                    "active_requests": in_flight(b),
                    "programs_assigned": per_engine.get(b.id, 0),
                    "workload": in_flight(b),
                }
                for b in self._engines
                if b.id not in self._removed
            },
        }
