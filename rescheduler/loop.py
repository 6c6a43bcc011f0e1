"""The rescheduling loop: every interval, take a view of the fleet, decide, carry it out.

Thin on purpose: the decision is `decide`'s (pure, rescheduler/decide.py); where the view
comes from and how a request moves are behind two small protocols, so one loop serves both
modes: inside `fleet-proxy serve` (the proxy's own state and live requests) and standalone
(`fleet-proxy reschedule`, a running proxy's admin API). One cycle at a time: the next view is
taken only after the executor is done with the last plan, so a request is never in two.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from fleet.clock import Clock, SystemClock
from rescheduler.config import ReschedulerConfig
from rescheduler.decide import Plan, decide
from rescheduler.executor import Executor, MoveOutcome
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.settling import Settling
from rescheduler.view import ClusterView, Migration

log = logging.getLogger("fleet_proxy.rescheduler")

Decide = Callable[[ClusterView, ReschedulerConfig, float], Plan]


class ViewSource(Protocol):
    async def view(self) -> ClusterView: ...


@dataclass(frozen=True, slots=True)
class CycleRecord:
    """One cycle, as GET /admin/rescheduler shows it."""

    started_at: float  # wall-clock (unix) seconds
    duration_s: float
    instances: int
    schedulable: int
    requests: int
    movable: int
    pairs: tuple[Migration, ...]
    notes: dict[str, str]  # per policy that ran: why it moved nothing, else ""
    outcomes: dict[str, int]  # outcome -> requests
    moves: tuple[MoveOutcome, ...]
    error: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def summarize(view: ClusterView) -> tuple[int, int, int, int]:
    """Instances, schedulable ones, live requests, movable requests."""
    requests = [r for i in view.instances for r in i.requests]
    return (
        len(view.instances),
        sum(1 for i in view.instances if i.schedulable),
        len(requests),
        sum(1 for r in requests if r.movable),
    )


class ReschedulerLoop:
    def __init__(
        self,
        source: ViewSource,
        executor: Executor,
        config: ReschedulerConfig,
        metrics: ReschedulerMetrics,
        *,
        interval_s: float = 0.5,
        history: int = 20,
        decide: Decide = decide,
        clock: Clock | None = None,
    ) -> None:
        self.source = source
        self.executor = executor
        self.config = config
        self.metrics = metrics
        self.interval_s = interval_s
        self.decide = decide
        self.clock: Clock = clock or SystemClock()
        self._history: deque[CycleRecord] = deque(maxlen=history)
        # Idle cycles (most of them) would soon push the ones that moved out of the history.
        self._migrating: deque[CycleRecord] = deque(maxlen=history)
        self._settling = Settling()

    def history(self) -> list[CycleRecord]:
        """The last cycles, oldest first."""
        return list(self._history)

    def migrating_history(self) -> list[CycleRecord]:
        """The last cycles that planned a migration, oldest first."""
        return list(self._migrating)

    async def run(self) -> None:
        while True:
            start = self.clock.now()
            await self.cycle()
            await asyncio.sleep(max(0.0, self.interval_s - (self.clock.now() - start)))

    async def cycle(self) -> CycleRecord:
        started_at = time.time()
        t0 = time.perf_counter()
        try:
            record = await self._cycle(started_at, t0)
        except Exception as e:  # one bad cycle (the proxy unreachable, say) must not end it
            log.warning("rescheduling cycle failed: %s: %s", type(e).__name__, e)
            record = CycleRecord(
                started_at, time.perf_counter() - t0, 0, 0, 0, 0, (), {}, {}, (), repr(e)
            )
        self.metrics.cycles.inc()
        self.metrics.cycle_seconds.observe(record.duration_s)
        self._history.append(record)
        if record.pairs:
            self._migrating.append(record)
        return record

    async def _cycle(self, started_at: float, t0: float) -> CycleRecord:
        view = self._settling.apply(await self.source.view())
        # The view's own time: a standalone rescheduler's clock is not the proxy's.
        plan = self.decide(view, self.config, view.taken_at)
        for o in plan.outcomes:
            log.debug(
                "rescheduler %s: sources=%s targets=%s migrations=%s note=%s",
                o.policy, list(o.sources), list(o.targets),
                [(m.source, m.target, len(m.requests)) for m in o.migrations], o.note or "-",
            )  # fmt: skip
        for m in plan.migrations:
            self.metrics.pairs.labels(m.policy).inc()
        moves: Sequence[MoveOutcome] = ()
        if plan.migrations:
            moves = await self.executor.execute(plan.migrations)
            self._settling.moved(moves)
        outcomes: dict[str, int] = {}
        for mv in moves:
            outcomes[mv.outcome] = outcomes.get(mv.outcome, 0) + 1
        if plan.migrations:
            log.info(
                "rescheduler: %s; %s",
                ", ".join(
                    f"{m.policy} {m.source}->{m.target} ({len(m.requests)})"
                    for m in plan.migrations
                ),
                " ".join(f"{k}={v}" for k, v in sorted(outcomes.items())),
            )
        instances, schedulable, requests, movable = summarize(view)
        return CycleRecord(
            started_at=started_at,
            duration_s=time.perf_counter() - t0,
            instances=instances,
            schedulable=schedulable,
            requests=requests,
            movable=movable,
            pairs=plan.migrations,
            notes={o.policy: o.note for o in plan.outcomes},
            outcomes=outcomes,
            moves=tuple(moves),
        )
