"""The hybrid "unified" policy (the LMetric authors' algorithm): LMetric + affinity.

For a request with a session (no session: step 3 alone):
1. Affinity gate (modes "never" and "when_cold"). The owner is the candidate holding the
   longest cached prefix of the prompt (policies/pickers/cache_owner.py: by the engines'
   KV-cache events where the precise index stands for a backend, else by this process's
   approximate index; ties to the lower BS, then the session's rendezvous order). Its
   cache_ratio is the share of the prompt's tokens it holds. The request goes to the owner
   when cache_ratio > `cache_ratio_threshold` (0.5) and BS(owner) <= average BS x
   `overload_factor` (2.0); an overloaded owner sends it to step 3.
2. `session_home`, what the session's rendezvous home (policies/rendezvous.py) adds:
   "never": nothing. "when_cold": when no candidate holds more than the threshold, the home
   unless BS(home) > average x `overload_factor`. "always": step 1 is skipped; the home unless
   it is overloaded, whatever holds the cache. "auto" (the default): "never" when the routing
   configuration follows the engines' KV events (`precise_prefix`), "always" without them.
3. Otherwise LMetric with its tie-breakers (uncached tokens, BS, rotation), over the candidates
   with BS <= average x `ceiling_factor` (2.0) while some candidate is under it.

Why "auto": paired trials (3 seeds each, a 4-engine simulated H100 fleet, on a shared loaded
machine; docs/policies.md) gave the owner rule a lower TTFT p99 with KV events (1,877 against
2,675 ms, interval not excluding 0) and a lower TPOT and E2E p90 (intervals excluding 0), with
requests spread evenly; without events it had a higher TTFT p99 on the chat workload (4,045
against 3,181 ms, interval excluding 0) and no difference on ShareGPT. Rechecked after the
simulator began sending a streamed chat's first bytes with its first token, as vLLM does:
without events the owner rule was again no different on ShareGPT and worse on the chats (TTFT
p90 +242 ms, p99 +904 ms, intervals excluding 0). A default is changed only where trials
show it is not worse.

The ceiling settles an edge case of gate-then-LMetric: an overloaded owner with cache_ratio 1.0
has 0 uncached tokens, so with no pending prefill its P_tokens x BS is 0 and it wins the
uncached-tokens tie-breaker: LMetric re-elects it. `ceiling_factor: null` gives that rule
exactly. BS is `policies.loads.batch_size`.

No session table: a turn sent away (its owner overloaded or drained) leaves the longer prefix
where it went, so the next turn follows it there. Every process computes the same owner when
the engines publish KV events; without them each process knows only the prompts it sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.loads import batch_size
from policies.pickers.cache_owner import cache_owner
from policies.pickers.lmetric import lmetric_argmin
from policies.pickers.rotation import Rotation
from policies.rendezvous import home as rendezvous_home

SessionHome = Literal["auto", "never", "when_cold", "always"]


class UnifiedParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_ratio_threshold: float = Field(0.5, ge=0.0, le=1.0)
    overload_factor: float = Field(2.0, gt=0.0)
    ceiling_factor: float | None = Field(2.0, gt=0.0)
    session_home: SessionHome = "auto"


class UnifiedPicker(PluginBase):
    type = "unified-picker"

    def __init__(self, params: UnifiedParams, services: RoutingServices, name: str = "") -> None:
        super().__init__(name)
        services.use_prefix_index()
        self.params = params
        self._rotation = Rotation()
        self.affinity_hits = 0
        self.cold_sessions = 0
        self.gate_load_failures = 0
        self.home_placements = 0
        self.ceiling_exclusions = 0

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        p = self.params
        n = len(candidates)
        avg = sum(batch_size(b) for b in candidates) / n
        sid = req.ctx.session_id
        if sid is not None:
            chosen = self._affinity(req, candidates, sid, avg)
            if chosen is not None:
                return chosen
        pool = candidates
        if p.ceiling_factor is not None:
            limit = avg * p.ceiling_factor
            under = [b for b in candidates if batch_size(b) <= limit]
            if under and len(under) < n:
                self.ceiling_exclusions += 1
                pool = under
        req.reasons.append("unified: lmetric")
        return lmetric_argmin(req, pool, self._rotation.start(len(pool)))

    def _affinity(
        self, req: SchedulingRequest, candidates: Sequence[Backend], sid: str, avg: float
    ) -> Backend | None:
        """Steps 1 and 2: where the session's request goes, or None for LMetric."""
        mode = self.params.session_home
        if mode == "auto":
            # The owner rule measured better only where every process reads the owner from
            # the engines' events; by per-process indexes alone the rendezvous home did.
            mode = "never" if req.services.precise_index is not None else "always"
        overload = avg * self.params.overload_factor
        if mode != "always":
            owner = cache_owner(req, candidates, sid)
            if req.explain and owner is not None:
                req.note(owner.backend.id, "owner", 1.0)
                req.note(owner.backend.id, "cache_ratio", owner.ratio)
                req.note(owner.backend.id, "avg_num_requests", avg)
            if owner is not None and owner.ratio > self.params.cache_ratio_threshold:
                if batch_size(owner.backend) <= overload:
                    self.affinity_hits += 1
                    req.reasons.append("unified: affinity")
                    return owner.backend
                self.gate_load_failures += 1
                return None
            self.cold_sessions += 1
            if mode == "never":
                return None
        home = rendezvous_home(sid, candidates)
        if req.explain:
            req.note(home.id, "home", 1.0)
            req.note(home.id, "avg_num_requests", avg)
        if batch_size(home) > overload:
            self.gate_load_failures += 1
            return None
        self.home_placements += 1
        req.reasons.append("unified: session home")
        return home

    def stats(self) -> dict[str, int]:
        return {
            "affinity_hits": self.affinity_hits,
            "cold_sessions": self.cold_sessions,
            "gate_load_failures": self.gate_load_failures,
            "home_placements": self.home_placements,
            "ceiling_exclusions": self.ceiling_exclusions,
        }
