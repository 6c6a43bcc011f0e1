"""Carrying out a plan: every request of its migrations moved concurrently, at most
`max_concurrent` at a time, each within `timeout` seconds; a failure is counted and the rest
go on.

How one request moves is a `Mover`'s: `LocalMover` moves this process's own live requests
(`fleet-proxy serve`), `AdminMover` (rescheduler/standalone.py) asks a running proxy's admin
API to. Outcomes: ok | failed | not_movable | finished (it ended, or vanished since the view
was taken) | timeout (still moving when the timeout came; it may yet land).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fleet.live import LiveTable, NotMovable
from fleet.registry import FleetRegistry
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.view import Migration

log = logging.getLogger("fleet_proxy.rescheduler")


@dataclass(frozen=True, slots=True)
class MoveOutcome:
    policy: str
    key: str
    source: str
    target: str
    outcome: str
    detail: str = ""
    seconds: float = 0.0


class Mover(Protocol):
    async def move(self, key: str, source: str, target: str, reason: str) -> tuple[str, str]:
        """Move request `key`, if it is still on `source`, to `target`; (outcome, detail)."""
        ...


class Executor(Protocol):
    async def execute(self, migrations: Sequence[Migration]) -> list[MoveOutcome]: ...


class LocalMover:
    """Moves this process's own live requests (each worker process has its own table).

    The checks of the admin API's move (proxy/control/operations.py `move_one`), written here
    because the rescheduler does not import the proxy; the timeout is the executor's."""

    def __init__(self, live: LiveTable, fleet: FleetRegistry) -> None:
        self.live = live
        self.fleet = fleet

    async def move(self, key: str, source: str, target: str, reason: str) -> tuple[str, str]:
        entry = self.live.by_upstream_id(key)
        if entry is None:
            return "finished", "no longer live"
        if entry.backend_id != source:
            return "not_movable", f"no longer on {source}"
        backend = self.fleet.get(target)
        if backend is None:
            return "failed", f"no backend {target!r}"
        try:
            result = await entry.move(backend, reason=reason)
        except NotMovable as e:
            return "not_movable", e.reason
        return result.outcome, result.detail


class BoundedExecutor:
    def __init__(
        self,
        mover: Mover,
        metrics: ReschedulerMetrics,
        *,
        max_concurrent: int = 10,
        timeout: float = 5.0,
    ) -> None:
        self.mover = mover
        self.metrics = metrics
        self.timeout = timeout
        self._slots = asyncio.Semaphore(max_concurrent)

    async def execute(self, migrations: Sequence[Migration]) -> list[MoveOutcome]:
        seen: set[str] = set()
        jobs = []
        for m in migrations:
            for key in m.requests:
                if key in seen:  # a plan names a request once; never move one twice a cycle
                    continue
                seen.add(key)
                jobs.append(self._one(m, key))
        return list(await asyncio.gather(*jobs))

    async def _one(self, m: Migration, key: str) -> MoveOutcome:
        async with self._slots:
            start = time.perf_counter()
            try:
                outcome, detail = await asyncio.wait_for(
                    self.mover.move(key, m.source, m.target, m.policy), self.timeout
                )
            except TimeoutError:
                outcome, detail = "timeout", f"not done within {self.timeout:g}s"
            except Exception as e:  # one broken move must not stop the others
                log.warning("rescheduler: moving %s failed: %r", key, e)
                outcome, detail = "failed", f"{type(e).__name__}: {e}"
            seconds = time.perf_counter() - start
        self.metrics.count_move(m.policy, outcome)
        return MoveOutcome(m.policy, key, m.source, m.target, outcome, detail, seconds)
