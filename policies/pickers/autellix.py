"""Autellix load balancer (the Autellix paper's Algorithm 2), with rendezvous program homes.

- At most `threshold_tokens` (2048) prefill tokens: LEAST_USED, the backend with the fewest
  requests in flight (ties rotate).
- Above: the program's home, its rendezvous home among the candidates (policies/rendezvous.py),
  however busy, as the paper keeps a program on its engine. Where the paper's program table
  places a program on the least-used engine at first sight, the hash spreads programs evenly
  by count; in exchange every worker and every replica sends a program's large calls to the
  same engine with nothing shared. When the home is not a candidate the next engine in the
  program's rendezvous order is its home, and the program comes back when it returns.

The program is the `x-program-id` header, else the session id; a large request with neither
is balanced like a small one. Workload is the proxy's in-flight count, so Algorithm 2's
`complete_request` is the proxy's own accounting and needs no hook here.

The programs this process has seen are remembered for `stats()` only, never for routing:
each with the engine of its last large call, until `end_program` (admin call), `idle_ttl_s`
without a large call, or LRU past `max_programs` drops it. Dropping one changes nothing of
where its next call goes.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import PluginBase, SchedulingRequest
from policies.loads import in_flight
from policies.pickers.baseline import least_in_flight
from policies.pickers.rotation import Rotation
from policies.rendezvous import home as rendezvous_home


class AutellixParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    threshold_tokens: int = Field(2048, ge=0)
    idle_ttl_s: float | None = Field(600.0, gt=0.0)
    max_programs: int = Field(100_000, ge=1)


@dataclass(slots=True)
class _Seen:
    backend_id: str  # the engine of its last large call; "" once that engine was removed
    last_seen: float


class AutellixPicker(PluginBase):
    type = "autellix-picker"

    def __init__(self, params: AutellixParams, name: str = "") -> None:
        super().__init__(name)
        self.params = params
        self._seen: OrderedDict[str, _Seen] = OrderedDict()  # oldest last_seen first
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
            return least_in_flight(candidates, self._rotation.start(len(candidates)))
        self.large_requests += 1
        home = rendezvous_home(pid, candidates)
        self._note(pid, home.spec.id, req.now)
        req.reasons.append("autellix: large -> program's home")
        return home

    def _note(self, pid: str, backend_id: str, now: float) -> None:
        seen = self._seen.get(pid)
        if seen is None:
            self.locality_assigns += 1
            self._seen[pid] = _Seen(backend_id, now)
            while len(self._seen) > self.params.max_programs:
                self._seen.popitem(last=False)
            return
        if seen.backend_id == backend_id:
            self.locality_hits += 1
        else:
            self.reassignments += 1  # its engine left, or one that joined ranks first now
            seen.backend_id = backend_id
        seen.last_seen = now
        self._seen.move_to_end(pid)

    def _expire(self, now: float) -> None:
        ttl = self.params.idle_ttl_s
        if ttl is None:
            return
        while self._seen:
            pid, seen = next(iter(self._seen.items()))
            if now - seen.last_seen <= ttl:
                break
            del self._seen[pid]
            self.expired_programs += 1

    def end_program(self, program_id: str) -> bool:
        if self._seen.pop(program_id, None) is None:
            return False
        self.ended_programs += 1
        return True

    def on_backend_removed(self, backend_id: str) -> None:
        # A backend back under the same id is a fresh engine: its programs' next large calls
        # count as reassignments, not locality hits.
        self._removed.add(backend_id)
        for seen in self._seen.values():
            if seen.backend_id == backend_id:
                seen.backend_id = ""

    def stats(self) -> dict[str, Any]:
        per_engine: dict[str, int] = {}
        for seen in self._seen.values():
            if seen.backend_id:
                per_engine[seen.backend_id] = per_engine.get(seen.backend_id, 0) + 1
        return {
            "total_requests": self.total_requests,
            "small_requests": self.small_requests,
            "large_requests": self.large_requests,
            "locality_hits": self.locality_hits,
            "locality_assigns": self.locality_assigns,
            "reassignments": self.reassignments,
            "expired_programs": self.expired_programs,
            "ended_programs": self.ended_programs,
            "active_programs": len(self._seen),
            "engines": {
                b.id: {
                    "active_requests": in_flight(b),
                    "programs_homed": per_engine.get(b.id, 0),
                    "workload": in_flight(b),
                }
                for b in self._engines
                if b.id not in self._removed
            },
        }
