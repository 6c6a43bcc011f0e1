"""The dispatch core of one model's pool: bands by priority, tenants inside a band, requests
inside a tenant. `offer` enqueues (or refuses when full), `decide` says what to do now: refuse
what waited past its band's TTL, and dispatch the next request when the pool has room.

Strict priority between bands: a band is served only while every higher one is empty.
No I/O, no clock of its own: the caller passes `now` and whether the pool is saturated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from flowcontrol.policies import Fairness, Ordering, Waiting

K = TypeVar("K")

# Why a request was refused.
TTL_EXPIRED = "ttl_expired"
BAND_FULL = "band_full"
TENANT_FULL = "tenant_full"
REJECT_REASONS = (TTL_EXPIRED, BAND_FULL, TENANT_FULL)


class Dispatch(NamedTuple):
    request: Waiting


class Reject(NamedTuple):
    request: Waiting
    reason: str


Action = Dispatch | Reject


@dataclass(frozen=True, slots=True)
class BandLimits:
    queue_ttl: float
    capacity: int
    tenant_capacity: int


@dataclass(slots=True)
class _Band:
    priority: int
    limits: BandLimits
    fairness: Fairness
    tenants: dict[str, list[Waiting]]
    count: int = 0


class FlowQueues:
    """The waiting requests of one pool. `limits(priority)` gives a band's limits,
    `fairness()` a fresh policy for a new band; `ordering` is shared by all pools."""

    def __init__(
        self,
        limits: Callable[[int], BandLimits],
        fairness: Callable[[], Fairness],
        ordering: Ordering,
    ) -> None:
        self._limits = limits
        self._fairness = fairness
        self._ordering = ordering
        self._bands: dict[int, _Band] = {}
        self._order: list[int] = []  # band priorities, highest first
        self.count = 0

    def deadline(self, priority: int, now: float) -> float:
        """When a request of `priority` arriving `now` would expire."""
        return now + self._limits(priority).queue_ttl

    def offer(self, w: Waiting, elsewhere: tuple[int, int] = (0, 0)) -> Reject | None:
        """Enqueue `w`, or the refusal when its band or its tenant's share of it is full.
        `elsewhere`: the requests of its band, and of its tenant in the band, waiting in other
        queues of the same pool (other worker processes), counted against the limits too."""
        band = self._band(w.priority)
        in_band, of_tenant = elsewhere
        if band.count + in_band >= band.limits.capacity:
            return Reject(w, BAND_FULL)
        queue = band.tenants.get(w.tenant)
        if len(queue or ()) + of_tenant >= band.limits.tenant_capacity:
            return Reject(w, TENANT_FULL)
        if queue is None:
            band.tenants[w.tenant] = [w]
            band.fairness.activated(w.tenant)
        else:
            queue.append(w)
        band.count += 1
        self.count += 1
        return None

    def remove(self, w: Waiting) -> bool:
        """Take `w` out (its client left); False when it is not waiting here."""
        band = self._bands.get(w.priority)
        queue = band.tenants.get(w.tenant) if band is not None else None
        if band is None or queue is None:
            return False
        try:
            queue.remove(w)
        except ValueError:
            return False
        self._left(band, w.tenant, queue)
        return True

    def decide(
        self,
        saturated: bool,
        now: float,
        elsewhere: int | None = None,
        usage: Callable[[int], Mapping[str, int]] | None = None,
    ) -> list[Action]:
        """Expired requests to refuse, then, when the pool has room, one to dispatch (the
        caller accounts for it and asks again). `elsewhere`: the highest band waiting for
        this pool in another queue (another worker process); while it is above every band
        here, the room is left to it, so strict priority holds across the queues.
        `usage(priority)`: what each tenant uses of that band (the requests it runs, or the
        service it received lately, in the whole proxy); given, the room goes to a waiting
        tenant using less than the one fairness picked (the least first)."""
        actions: list[Action] = [Reject(w, TTL_EXPIRED) for w in self._expire(now)]
        if not saturated and self.count:
            top = self.top_priority()
            if elsewhere is None or top is None or top >= elsewhere:
                actions.append(Dispatch(self._next(now, usage)))
        return actions

    def _next(self, now: float, usage: Callable[[int], Mapping[str, int]] | None) -> Waiting:
        for priority in self._order:  # strict: the highest band with anything waiting
            band = self._bands[priority]
            if band.count:
                tenant = band.fairness.pick()
                if usage is not None and len(band.tenants) > 1:
                    tenant = _least_using(tenant, band.tenants, usage(priority))
                queue = band.tenants[tenant]
                w = self._ordering.pick(queue, now)
                queue.remove(w)
                band.fairness.dispatched(tenant, w.cost)
                self._ordering.credit(w.program, w.cost)
                self._left(band, tenant, queue)
                return w
        raise AssertionError("_next with nothing waiting")

    def _expire(self, now: float) -> list[Waiting]:
        expired: list[Waiting] = []
        for band in self._bands.values():
            if not band.count:
                continue
            for tenant, queue in list(band.tenants.items()):
                # A band's TTL is one number: a tenant's queue expires from its oldest on.
                n = 0
                while n < len(queue) and queue[n].deadline <= now:
                    n += 1
                if n:
                    expired += queue[:n]
                    del queue[:n]
                    self._left(band, tenant, queue, n)
        return expired

    def _left(self, band: _Band, tenant: str, queue: list[Waiting], n: int = 1) -> None:
        band.count -= n
        self.count -= n
        if not queue:
            del band.tenants[tenant]
            band.fairness.deactivated(tenant)

    def _band(self, priority: int) -> _Band:
        band = self._bands.get(priority)
        if band is None:
            band = _Band(priority, self._limits(priority), self._fairness(), {})
            self._bands[priority] = band
            self._order = sorted(self._bands, reverse=True)
        return band

    def tenants(self, priority: int) -> list[str]:
        """The tenants with requests waiting in the band of `priority`."""
        band = self._bands.get(priority)
        return list(band.tenants) if band is not None else []

    def top_priority(self) -> int | None:
        """The highest band with requests waiting; None when none waits."""
        for priority in self._order:
            if self._bands[priority].count:
                return priority
        return None

    def depths(self) -> dict[tuple[int, str], int]:
        """Requests waiting per (priority, tenant)."""
        return {(p, t): len(q) for p, band in self._bands.items() for t, q in band.tenants.items()}

    def view(self, now: float) -> list[dict[str, Any]]:
        """The bands for `GET /admin/flow`, highest priority first."""
        out: list[dict[str, Any]] = []
        for priority in self._order:
            band = self._bands[priority]
            out.append(
                {
                    "priority": priority,
                    "waiting": band.count,
                    "capacity": band.limits.capacity,
                    "queue_ttl": band.limits.queue_ttl,
                    "tenants": {
                        t: {
                            "waiting": len(q),
                            "oldest_wait_s": round(now - q[0].arrived, 3),
                            "prompt_tokens": sum(w.cost for w in q),
                        }
                        for t, q in band.tenants.items()
                    },
                }
            )
        return out


def _least_using(picked: str, waiting: Iterable[str], usage: Mapping[str, int]) -> str:
    """`picked`, unless a waiting tenant uses less: then the one using least."""
    least = min(waiting, key=lambda t: usage.get(t, 0))
    return least if usage.get(least, 0) < usage.get(picked, 0) else picked


def fair_share_victim(
    waiting: Iterable[K], running: Mapping[K, int], among: Iterable[K] | None = None
) -> K | None:
    """The tenant of a band that gives up a running request to one waiting in it: the one
    running the most (of `among`, the tenants that can be asked; default all), when that is
    at least two more than the waiting tenant running the fewest (after the move it still
    runs as many as that one: no seat ping-pongs back)."""
    waiting = list(waiting)
    able = list(running if among is None else among)
    if not waiting or not able:
        return None
    poorest = min(running.get(t, 0) for t in waiting)
    richest = max(able, key=lambda t: running.get(t, 0))
    return richest if running.get(richest, 0) >= poorest + 2 else None
