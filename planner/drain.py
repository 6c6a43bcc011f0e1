"""Removing a worker without cutting a request: which worker to remove (`choose_victim`, pure)
and the drain procedure (`drain`).

The drain: stop routing to the worker (drain), move its movable live requests elsewhere
(evacuate), then wait, with a bounded poll, until none of its requests is left. Nothing is
aborted. If requests are still there at the deadline the worker is put back in rotation
(undrained) and left up, and the report says `drain_timeout`: the caller decides what next.
Only a worker with no request left is unregistered (DELETE), so its process may then stop.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from fleet.clock import Clock
from planner.connector import WorkerInfo
from planner.proxy_admin import ProxyAdmin

Sleep = Callable[[float], Awaitable[None]]


def choose_victim(
    workers: Sequence[WorkerInfo], live_tokens_by_worker: Mapping[str, Sequence[int]]
) -> WorkerInfo:
    """The cheapest worker to drain: its live requests hold the fewest tokens (prompt +
    generated, what moving them costs); ties by fewest requests, then by id."""
    if not workers:
        raise ValueError("no worker to choose from")

    def cost(w: WorkerInfo) -> tuple[int, int, str]:
        tokens = live_tokens_by_worker.get(w.id, ())
        return sum(tokens), len(tokens), w.id

    return min(workers, key=cost)


class DrainOutcome(StrEnum):
    DRAINED = "drained"  # no request left; unregistered
    DRAIN_TIMEOUT = "drain_timeout"  # requests left at the deadline; the worker stays up


@dataclass(frozen=True, slots=True)
class DrainReport:
    worker_id: str
    outcome: DrainOutcome
    remaining: int  # requests still on the worker when the drain ended
    waited_s: float
    evacuated: dict[str, int] = field(default_factory=dict)  # move outcome -> requests
    evacuate_error: str = ""  # the evacuate call failed: the requests are waited for instead
    started_with: int = 0  # requests on the worker once it stopped taking new ones

    def requests_by_fate(self) -> dict[str, int]:
        """What became of the requests it started with: `moved` by the evacuation, `left` on
        the worker at the end, `finished` there meanwhile (the rest)."""
        moved = self.evacuated.get("ok", 0)
        finished = max(0, self.started_with - moved - self.remaining)
        return {"moved": moved, "finished": finished, "left": self.remaining}


class DrainTimeout(RuntimeError):
    """A scale-down's drain ran out of time: the worker was left up and in rotation."""

    def __init__(self, report: DrainReport) -> None:
        super().__init__(
            f"worker {report.worker_id} still had {report.remaining} request(s) after "
            f"{report.waited_s:.1f}s of draining; left up"
        )
        self.report = report


def drained_or_raise(report: DrainReport) -> DrainReport:
    """The report of a drain that emptied the worker; `DrainTimeout` for one that did not."""
    if report.outcome is DrainOutcome.DRAIN_TIMEOUT:
        raise DrainTimeout(report)
    return report


async def live_tokens(proxy: ProxyAdmin) -> dict[str, list[int]]:
    """Each backend's live requests' tokens, as `choose_victim` reads them."""
    tokens: dict[str, list[int]] = {}
    for r in await proxy.live_requests():
        tokens.setdefault(r.backend, []).append(r.tokens)
    return tokens


async def remaining_on(proxy: ProxyAdmin, worker_id: str) -> int:
    """Requests still on the worker: the live table's and the backend's in-flight count, the
    larger (a request may be in flight before it is live, or not movable at all)."""
    live = sum(1 for r in await proxy.live_requests() if r.backend == worker_id)
    in_flight = next((b.in_flight for b in await proxy.backends() if b.id == worker_id), 0)
    return max(live, in_flight)


async def drain(
    proxy: ProxyAdmin,
    worker_id: str,
    deadline_s: float,
    clock: Clock,
    *,
    poll_s: float = 0.2,
    sleep: Sleep = asyncio.sleep,
) -> DrainReport:
    start = clock.now()
    await proxy.drain(worker_id)
    evacuated: dict[str, int] = {}
    error = ""
    try:
        started_with = await remaining_on(proxy, worker_id)
        try:
            evacuated = await proxy.evacuate(worker_id)
        except Exception as e:  # moves are an optimisation: unmoved requests still finish there
            error = f"{type(e).__name__}: {e}"
        while True:
            left = await remaining_on(proxy, worker_id)
            waited = clock.now() - start
            if left == 0:
                await proxy.remove_backend(worker_id)
                return DrainReport(
                    worker_id, DrainOutcome.DRAINED, 0, waited, evacuated, error, started_with
                )
            if waited >= deadline_s:
                # Back in rotation: a worker kept up should serve, not sit idle draining.
                await proxy.undrain(worker_id)
                return DrainReport(
                    worker_id, DrainOutcome.DRAIN_TIMEOUT, left, waited, evacuated, error,
                    started_with,
                )  # fmt: skip
            await sleep(min(poll_s, max(0.0, deadline_s - waited)))
    except Exception:
        # The proxy failed us mid-drain: put the worker back in rotation if it can be.
        with contextlib.suppress(Exception):
            await proxy.undrain(worker_id)
        raise
