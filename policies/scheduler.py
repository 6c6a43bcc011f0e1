"""The policy the proxy holds: a profile handler over named profiles, plus the shared services.

`pick` is pure routing (no I/O, no await). After a decision it records what the fleet will now
hold (the prompt's blocks in the prefix index of the chosen backends, sized from their
`cache_config_info`) and lets plugins with an `on_picked` hook remember affinities. The other
calls of the policy seam (policies/policy.py) fan out to the plugins that declare the matching
hook (policies/framework.py), collected once here.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from fleet.prefix import capacity_from_cache_config
from fleet.types import Backend
from policies.framework import (
    BackendObserver,
    MetricsUser,
    PickObserver,
    ProfileHandler,
    ProfileRunner,
    ProgramKeeper,
    RoutingServices,
    SchedulingRequest,
    StatsReporter,
)
from policies.metrics import PoolSource, SchedulerMetrics
from policies.policy import Decision, NoCandidate, RequestContext


class Scheduler:
    def __init__(
        self,
        name: str,
        profiles: Mapping[str, ProfileRunner],
        handler: ProfileHandler,
        services: RoutingServices,
        plugins: Sequence[object],
        explain_all: bool = False,
    ) -> None:
        self.name = name
        self.profiles = dict(profiles)
        self.handler = handler
        self.services = services
        self.plugins = tuple(plugins)
        self.explain_all = explain_all
        self._picked = [p.on_picked for p in self.plugins if isinstance(p, PickObserver)]
        self._removed = [
            p.on_backend_removed for p in self.plugins if isinstance(p, BackendObserver)
        ]
        self._programs = [p.end_program for p in self.plugins if isinstance(p, ProgramKeeper)]
        self._metric_users = [p.bind_metrics for p in self.plugins if isinstance(p, MetricsUser)]
        self._reporters = [p for p in self.plugins if isinstance(p, StatsReporter)]
        self._metrics: SchedulerMetrics | None = None
        self.decisions = 0
        self.failures = 0

    def pick(self, ctx: RequestContext, candidates: Sequence[Backend], now: float) -> Decision:
        metrics = self._metrics
        t0 = time.perf_counter() if metrics else 0.0
        req = SchedulingRequest(
            ctx=ctx,
            now=now,
            services=self.services,
            explain=ctx.debug or self.explain_all,
            timer=metrics.observe_plugin if metrics else None,
        )
        try:
            if not candidates:
                raise NoCandidate(f"no backend serves {ctx.model!r}")
            decision = self.handler.handle(req, candidates, self.profiles)
        except NoCandidate:
            self.failures += 1
            if metrics:
                metrics.attempt("failure", ctx.model, None)
            raise
        if req.explain:
            decision.scores = req.receipt
        if req.reasons and not decision.reason:
            decision.reason = "; ".join(req.reasons)
        if self.services.prefix_index is not None:
            decision.prefill_tokens = req.uncached_tokens(decision.target.id)
            if decision.prefill is not None:
                decision.prefill_leg_tokens = req.uncached_tokens(decision.prefill.id)
        self._record(req, decision)
        for on_picked in self._picked:
            on_picked(req, decision)
        self.decisions += 1
        if metrics:
            metrics.attempt("success", ctx.model, decision.target)
            metrics.e2e.observe(time.perf_counter() - t0)
        return decision

    def _record(self, req: SchedulingRequest, decision: Decision) -> None:
        index = self.services.prefix_index
        if index is None:
            return
        hashes = req.hashes()
        if not hashes:
            return  # a prompt shorter than one block leaves nothing to remember
        if self._metrics:
            ratio = req.prefix().ratio(decision.target.id)
            self._metrics.hit_ratio.observe(ratio)
            self._metrics.hit_bytes.observe(req.cached_chars(decision.target.id))
        for backend in (decision.target, decision.prefill):
            if backend is None:
                continue
            snap = backend.snapshot
            if (
                self.services.auto_capacity
                and snap is not None
                and snap.metrics.block_size
                and snap.metrics.num_gpu_blocks
            ):
                blocks = capacity_from_cache_config(
                    snap.metrics.block_size, snap.metrics.num_gpu_blocks, index.chars_per_block
                )
                if blocks != index.capacity(backend.id):
                    index.set_capacity(backend.id, blocks)
            index.record(backend.id, hashes)

    # The rest of the policy seam (policies/policy.py).

    def on_backend_removed(self, backend_id: str) -> None:
        if self.services.prefix_index is not None:
            self.services.prefix_index.remove_backend(backend_id)
        for removed in self._removed:
            removed(backend_id)

    def keeps_programs(self) -> bool:
        return bool(self._programs)

    def end_program(self, program_id: str) -> bool:
        ended = False
        for end in self._programs:
            if end(program_id):
                ended = True
        return ended

    def bind_metrics(self, registry: CollectorRegistry, pools: PoolSource) -> None:
        """Register the scheduler's metrics; `pools` gives, when /metrics is scraped, the
        backends that may take a request now per model (the fleet's, not one pick's: a retry
        is offered only the backends not tried yet)."""
        self._metrics = SchedulerMetrics(registry, pools, lambda: self.services.prefix_index)
        for bind in self._metric_users:
            bind(registry)

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "policy": self.name,
            "decisions": self.decisions,
            "failures": self.failures,
        }
        index = self.services.prefix_index
        if index is not None:
            out["prefix_index_blocks"] = index.size()
        for plugin in self._reporters:
            out[plugin.name] = plugin.stats()
        return out
