"""Flow control at the gateway: while a model's backends are saturated, its requests wait
here, by priority band, tenant and program, and are routed when dispatched (late binding: the
routing decision is made then, with the fleet as it is then). Below saturation a request
passes after one check of the pool. Off unless `flow_control` is configured: the Forwarder
then holds None and tests one attribute.

The decisions are flowcontrol/'s pure functions; this module is the loop around them: it
reads the fleet, wakes the waiting requests, and watches their clients while they wait.
One dispatch at a time per pool: the next waits until the last has been routed (charged to
its backend), so the saturation check counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleet.peer_load import (
    TENANT_ENTRIES,
    PeerTenant,
    QueueSummary,
    TenantLoad,
    pool_key,
    tenant_key,
)
from flowcontrol.config import FlowControlConfig
from flowcontrol.core import (
    BAND_FULL,
    TENANT_FULL,
    TTL_EXPIRED,
    BandLimits,
    FlowQueues,
    Reject,
    fair_share_victim,
)
from flowcontrol.identity import Identify, Identity
from flowcontrol.policies import FAIRNESS, ORDERING, Ordering, TokenWeighted, Waiting
from flowcontrol.rate_table import RateTable
from flowcontrol.saturation import EndpointSignals, endpoint_load, free_seats
from flowcontrol.service_memory import ServiceMemory
from policies.policy import RequestContext
from proxy.asgi import Receive
from proxy.errors import ProxyError
from proxy.ports import FinishedRequest, FlowTicket, RequestServices
from proxy.serving.rate_limiter import RateLimiter

log = logging.getLogger("fleet_proxy.flow_control")

# A request's way out of the queue: the `outcome` label of the queue-duration histogram,
# with llm-d's names.
DISPATCHED = "Dispatched"
OUTCOMES = {
    TTL_EXPIRED: "EvictedTTL",
    BAND_FULL: "RejectedCapacity",
    TENANT_FULL: "RejectedCapacity",
}
CLIENT_LEFT = "EvictedContextCancelled"
# With several workers, the longest a loop waits between two checks while requests wait here
# or in another worker (seconds).
PEER_RECHECK = 0.005
# With several workers, the tenants per pool and band whose recent service is kept (the
# least recently served are forgotten first): the rows the workers publish are recomputed
# every sync, and a client can name any tenant in a header.
SERVED_TENANTS = 256
# Why a stream was suspended: the `reason` label of the preemption counter.
PRIORITY = "priority"
FAIR_SHARE = "fair_share"


class WorkerPeers(Protocol):
    """The other worker processes (`--workers N`), as flow control uses them
    (proxy/control/peer_sync.py's PeerSync)."""

    @property
    def worker(self) -> int:
        """This worker's index."""

    def waiting_rows(self) -> list[tuple[int, int]]:
        """(worker, requests waiting in its queues) of every worker, as last published."""

    def exchange(self) -> None:
        """Publish this worker's load (and queue summary) now and read the others'."""

    def peer_top(self, pool: int) -> int | None:
        """The highest band waiting for `pool` (a `pool_key`) in another worker, as of the
        last exchange; None when none waits there."""

    def peer_tenants(self, pool: int, priority: int) -> Mapping[int, PeerTenant]:
        """Per tenant key, its requests running and waiting, and the service it received
        lately, in the band `priority` of `pool` in the other workers, as of the last
        exchange."""

    @property
    def peers_waiting(self) -> bool:
        """Whether another worker had requests waiting, as of the last exchange."""


class FlowGate:
    """The proxy's `FlowControl`. `key_tenant(authorization)`: the tenant the client's
    accepted API key names (None without client keys)."""

    def __init__(
        self,
        config: FlowControlConfig,
        core: RequestServices,
        key_tenant: Callable[[str | None], str | None] | None = None,
        registry: CollectorRegistry | None = None,
        rate_table: RateTable | None = None,
    ) -> None:
        self._config = config
        self._core = core
        self._key_tenant = key_tenant
        self._identify = Identify(config)
        self._rates: RateLimiter | None = None
        rate_limits = config.rate_limits
        if rate_limits is not None and rate_limits.any:
            self._rates = RateLimiter(rate_limits, rate_table or RateTable(), core.clock, registry)
        self._thresholds = config.saturation.thresholds(core.settings.scrape_interval)
        self._fairness = FAIRNESS[config.fairness]
        self._known_priorities = frozenset(
            [0, *config.objectives.values(), *config.tenant_priorities.values(), *config.bands]
        )
        self.ordering: Ordering = ORDERING[config.ordering](config.starvation_threshold)
        self.pools: dict[str, FlowQueues] = {}
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self._unbound: dict[str, int] = {}  # dispatched, not yet routed, per pool
        self._seq = itertools.count()
        self._wake: asyncio.Event | None = None
        self._loop: asyncio.Task[None] | None = None
        self._waited: Histogram | None = None
        self._outcomes: Counter | None = None
        # Tenants labelled by name in the metrics: configured ones and those API keys name
        # (both bounded by the configuration); any other is "other".
        self._known_tenants = set(config.tenant_priorities)
        if config.rate_limits is not None:
            self._known_tenants.update(config.rate_limits.tenants)
        self._preempted: Counter | None = None
        # Preemption: per pool, the sheddable streams it let through, by ticket key; the
        # suspension under way per pool (one at a time), and the keys suspended now.
        self._sheddable: dict[str, dict[int, tuple[FlowTicket, RequestContext]]] = {}
        self._suspending: dict[str, asyncio.Task[Any]] = {}
        self._suspended: set[int] = set()
        # With `fair_share_preemption`: per pool, every request it let through (running, or
        # suspended and waiting again), by ticket key.
        self._running: dict[str, dict[int, tuple[FlowTicket, RequestContext]]] = {}
        # Per pool, the backends that had no room at its last check that found room, and (with
        # seats reserved) the seats free at its last check.
        self._no_room: dict[str, tuple[str, ...]] = {}
        self._free: dict[str, int] = {}
        # With several workers: the other worker processes (`join`), and each pool's key in
        # the rows they share.
        self._peers: WorkerPeers | None = None
        self._pool_keys: dict[str, int] = {}
        self._tenant_keys: dict[str, int] = {}
        # With several workers and without fair-share preemption: per (pool, band), the
        # service this worker gave each tenant lately, which the workers add up to compare
        # tenants over the whole proxy.
        self._service: dict[tuple[str, int], ServiceMemory[str]] | None = None
        if registry is not None:
            self._bind_metrics(registry)

    def join(self, peers: WorkerPeers) -> None:
        """One of several workers: show every worker's waiting count, exchange load with the
        others before each dispatch cycle, leave a pool's room to a higher band waiting in
        another worker, and compare tenants by what the whole proxy gives them."""
        self._peers = peers
        if not self._config.fair_share_preemption:
            self._service = {}

    def queue_summary(self) -> QueueSummary:
        """What waits in this process's queues (published to the other workers): the count,
        and the highest band with its pool."""
        top: tuple[int, str] | None = None
        for model, pool in self.pools.items():
            priority = pool.top_priority()
            if priority is not None and (top is None or priority > top[0]):
                top = (priority, model)
        publish = self._config.fair_share_preemption or self._service is not None
        tenants = self._tenant_loads() if publish else ()
        if top is None:
            return QueueSummary(len(self._waiters), tenants=tenants)
        return QueueSummary(len(self._waiters), top[0], self._pool_key(top[1]), tenants)

    def _tenant_loads(self) -> tuple[TenantLoad, ...]:
        """What each tenant runs (with fair-share preemption), has waiting and was served
        lately (without) here, per pool and band, for the other workers: those with requests
        waiting first, then the busiest."""
        counts: dict[tuple[str, int, str], list[int]] = {}
        for model, running in self._running.items():
            for t, _ in running.values():
                if t.key not in self._suspended:
                    counts.setdefault((model, t.priority, t.tenant), [0, 0, 0])[0] += 1
        for model, pool in self.pools.items():
            for (priority, tenant), n in pool.depths().items():
                counts.setdefault((model, priority, tenant), [0, 0, 0])[1] += n
        if self._service is not None:
            now = self._core.clock.now()
            for (model, priority), memory in self._service.items():
                for tenant, served in memory.items(now):
                    counts.setdefault((model, priority, tenant), [0, 0, 0])[2] = _milli(served)
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1][1], -kv[1][0], -kv[1][2]))
        return tuple(
            TenantLoad(self._pool_key(m), p, self._tenant_key(t), running, waiting, served)
            for (m, p, t), (running, waiting, served) in ranked[:TENANT_ENTRIES]
            if running or waiting or served
        )

    def _tenant_key(self, tenant: str) -> int:
        key = self._tenant_keys.get(tenant)
        if key is None:
            if len(self._tenant_keys) >= 10_000:  # tenants from headers: bounded
                self._tenant_keys.clear()
            key = self._tenant_keys[tenant] = tenant_key(tenant)
        return key

    def _pool_key(self, model: str) -> int:
        key = self._pool_keys.get(model)
        if key is None:
            key = self._pool_keys[model] = pool_key(model)
        return key

    def _elsewhere(self, model: str) -> int | None:
        """The highest band waiting for `model` in another worker (None: none, or one
        worker)."""
        peers = self._peers
        return None if peers is None else peers.peer_top(self._pool_key(model))

    def workers_waiting(self) -> dict[int, int] | None:
        """Requests waiting per worker process; None with one process."""
        peers = self._peers
        if peers is None:
            return None
        waiting = dict(peers.waiting_rows())
        waiting[peers.worker] = len(self._waiters)  # its own, live
        return waiting

    def _limits(self, priority: int) -> BandLimits:
        return BandLimits(*self._config.band(priority))

    # --- the request's side

    async def admit(self, ctx: RequestContext, receive: Receive) -> FlowTicket:
        headers = ctx.headers
        key_tenant = self._key_tenant
        named = key_tenant(headers.get("authorization")) if key_tenant else None
        if named is not None and named not in self._known_tenants:
            self._known_tenants.add(named)
        who = self._identify(headers, named)
        rates = self._rates
        if rates is None:
            return await self._admit(ctx, receive, who)
        # Over its rate: refused before it queues. A request the proxy refuses after charging
        # it gets its tokens back.
        charge = rates.admit(who.tenant, ctx.prompt_tokens)
        try:
            ticket = await self._admit(ctx, receive, who)
        except BaseException as e:
            if charge is not None:
                if charge.tokens is not None:
                    rates.refund(who.tenant, charge.tokens)
                if isinstance(e, ProxyError):  # a refusal is an answer too: it has the quota
                    e.headers = [*e.headers, *charge.headers]
            raise
        return ticket if charge is None else ticket._replace(rate=charge)

    async def _admit(self, ctx: RequestContext, receive: Receive, who: Identity) -> FlowTicket:
        model = ctx.model
        now = self._core.clock.now()
        pool = self.pools.get(model)
        # Nothing queued before it, here or in a higher band of another worker, and room in
        # the pool: through at once.
        if (
            (pool is None or not pool.count)
            and not self._unbound.get(model)
            and (self._peers is None or not self._behind_peers(model, who.priority))
            and self.saturation(model, now) < 1.0
            and not (self._reserved(model) and self._runs_any(model, who.priority, who.tenant))
        ):
            self.ordering.credit(ctx.program_id, ctx.prompt_tokens)
            self._observe(who.tenant, who.priority, model, DISPATCHED, 0.0)
            ticket = FlowTicket(
                who.tenant, who.priority, 0.0, ctx.program_id, next(self._seq),
                avoid=self._no_room.get(model, ()),
            )  # fmt: skip
            return self._admitted(ctx, ticket)
        pool, w = self._waiting(model, who.tenant, who.priority, ctx, now)
        slot = self._enqueue(pool, w, model)
        left = asyncio.ensure_future(_client_leaves(receive))
        try:
            await asyncio.wait((slot, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            dispatched = self._leave(pool, w, model, slot)
            if not left.done():
                left.cancel()
        waited = self._core.clock.now() - w.arrived
        if left.done() and not left.cancelled() and not dispatched:
            left.exception()  # a receive() that failed: the client is gone all the same
            self._observe(w.tenant, w.priority, model, CLIENT_LEFT, waited)
            raise ProxyError(499, "client disconnected while its request was queued")
        error = slot.exception()
        if error is not None:
            raise error
        self._observe(w.tenant, w.priority, model, DISPATCHED, waited)
        ticket = FlowTicket(
            w.tenant, w.priority, waited, w.program, w.seq, avoid=self._no_room.get(model, ())
        )
        return self._admitted(ctx, ticket)

    def _behind_peers(self, model: str, priority: int) -> bool:
        """A higher band waits for `model` in another worker: the room is its."""
        elsewhere = self._elsewhere(model)
        return elsewhere is not None and elsewhere > priority

    def _waiting(
        self, model: str, tenant: str, priority: int, ctx: RequestContext, now: float
    ) -> tuple[FlowQueues, Waiting]:
        """The pool of `model` (made on its first queued request) and the request to queue."""
        pool = self.pools.get(model)
        if pool is None:
            pool = self.pools[model] = FlowQueues(self._limits, self._fairness, self.ordering)
        deadline = pool.deadline(priority, now)
        seq = next(self._seq)
        return pool, Waiting(
            seq, tenant, priority, ctx.program_id, ctx.prompt_tokens, now, deadline
        )

    def _enqueue(self, pool: FlowQueues, w: Waiting, model: str) -> asyncio.Future[None]:
        """Queue `w`: the future the dispatch loop resolves (or fails with the refusal)."""
        refused = pool.offer(w, self.waiting_elsewhere(model, w.priority, w.tenant))
        if refused is not None:
            self._observe(w.tenant, w.priority, model, OUTCOMES[refused.reason], 0.0)
            raise self._refusal(w, refused.reason)
        slot: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[w.seq] = slot
        self._kick()
        return slot

    def waiting_elsewhere(self, model: str, priority: int, tenant: str) -> tuple[int, int]:
        """The requests of the band `priority` of `model`'s pool, and of `tenant` in it, that
        wait in the other workers (as of the last sync; each publishes its 8 tenants with the
        most waiting): the band's and tenant's capacities hold for the whole proxy."""
        peers = self._peers
        if peers is None:
            return (0, 0)
        theirs = peers.peer_tenants(self._pool_key(model), priority)
        if not theirs:
            return (0, 0)
        own = theirs.get(self._tenant_key(tenant))
        return sum(e.waiting for e in theirs.values()), own.waiting if own is not None else 0

    def _leave(self, pool: FlowQueues, w: Waiting, model: str, slot: asyncio.Future[None]) -> bool:
        """`w` stops waiting (dispatched, refused, or its client gone); whether dispatched."""
        del self._waiters[w.seq]
        dispatched = slot.done() and not slot.cancelled() and slot.exception() is None
        if not slot.done():
            slot.cancel()
            pool.remove(w)
        if dispatched:
            self._bound(model)
        return dispatched

    def _admitted(self, ctx: RequestContext, ticket: FlowTicket) -> FlowTicket:
        service = self._service
        if service is not None:
            memory = service.get((ctx.model, ticket.priority))
            if memory is None:
                memory = service[ctx.model, ticket.priority] = ServiceMemory(
                    self._config.fairness_memory, SERVED_TENANTS
                )
            # What the fairness policy counts: a request, or its prompt tokens.
            tokens = self._config.fairness == TokenWeighted.name
            amount = max(ctx.prompt_tokens, 1) if tokens else 1
            memory.add(ticket.tenant, amount, self._core.clock.now())
        if self._config.fair_share_preemption:
            self._running.setdefault(ctx.model, {})[ticket.key] = (ticket, ctx)
            if self._peers is not None:
                self._kick()  # a tenant waiting in another worker may need its seat
        if self._config.preemption and ticket.priority < 0 and ctx.stream:
            self._sheddable.setdefault(ctx.model, {})[ticket.key] = (ticket, ctx)
            if self._peers is not None:
                self._kick()  # it may have to make room for a higher band in another worker
        return ticket

    def done(self, ticket: FlowTicket, finished: FinishedRequest | None) -> None:
        if self._sheddable:
            self._forget_sheddable(ticket.key)
        if self._running:
            for model, running in self._running.items():
                if running.pop(ticket.key, None) is not None:
                    if not running:
                        del self._running[model]
                    break
        if ticket.rate is not None and self._rates is not None:
            self._rates.settle(ticket.tenant, ticket.rate, finished)
        completion_tokens = finished.completion_tokens if finished is not None else None
        if completion_tokens and ticket.program:
            self.ordering.credit(ticket.program, completion_tokens)
        if self._waiters:
            self._kick()  # its room may go to a queued request now

    def _bound(self, model: str) -> None:
        """A dispatched request goes on to be routed (and charged) without yielding."""
        left = self._unbound[model] - 1
        if left:
            self._unbound[model] = left
        else:
            del self._unbound[model]
        if self._waiters:
            self._kick()

    # --- the pool

    def saturation(self, model: str, now: float) -> float:
        """llm-d's saturation of the backends that may take `model` now (1.0 or more: none has
        room). With no candidate at all, 0: routing answers such a request at once (404 or
        503), waiting would only delay that."""
        signals = []
        ids = []
        for b in self._core.fleet.candidates(model, now):
            snap = b.snapshot
            if snap is None:
                continue
            m = snap.metrics
            load = b.load
            signals.append(
                EndpointSignals(
                    m.waiting,
                    m.running,
                    m.kv_usage,
                    now - snap.taken_at,
                    load.in_flight + load.peer_in_flight,
                    snap.in_flight,
                )
            )
            ids.append(b.spec.id)
        if not signals:
            return 0.0
        thresholds = self._thresholds
        loads = [endpoint_load(s, thresholds) for s in signals]
        level = min(loads)
        if level < 1.0:
            # Late binding: the request dispatched now is routed among those with room.
            self._no_room[model] = tuple(i for i, x in zip(ids, loads, strict=True) if x >= 1.0)
        if self._config.fair_share_reserved_seats:
            self._free[model] = sum(free_seats(x, thresholds) for x in loads)
        return level

    def _reserved(self, model: str) -> bool:
        """Whether the room `model`'s pool has left (at its last check) is only the seats kept
        for tenants running nothing."""
        reserve = self._config.fair_share_reserved_seats
        return bool(reserve) and self._free.get(model, 0) <= reserve

    # --- the dispatch loop: runs while anything waits

    def _kick(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        self._wake.set()
        if self._loop is None or self._loop.done():
            self._loop = asyncio.create_task(self._run(), name="flow-control")

    async def _run(self) -> None:
        wake = self._wake
        assert wake is not None
        while self._waiters or self._watching_peers():
            wake.clear()
            try:
                self._cycle()
            except Exception:
                # The queue must keep moving (or expiring): the next cycle tries again.
                log.exception("flow control's dispatch cycle failed")
            if self._waiters or self._watching_peers():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self._recheck())

    def _recheck(self) -> float:
        """Seconds until the pools are checked again if nothing wakes the loop. With several
        workers and requests waiting here or in another, `PEER_RECHECK` at most: what the
        others do (a request ending, room left or a seat freed for this worker's queue, one
        of theirs waiting for a seat this worker holds) shows only in the shared rows, and
        nothing in this process wakes the loop for it."""
        interval = self._config.recheck_interval
        peers = self._peers
        if peers is not None and (self._waiters or peers.peers_waiting):
            return min(interval, PEER_RECHECK)
        return interval

    def _watching_peers(self) -> bool:
        """One of several workers, with sheddable streams that a higher band waiting in
        another worker may need suspended (or, with fair-share preemption, any request a
        tenant waiting there may need the seat of): the loop keeps looking while there are
        any."""
        return self._peers is not None and bool(self._sheddable or self._running)

    def _cycle(self) -> None:
        if self._peers is not None:
            # The other workers' dispatches since their last sync count against saturation,
            # and this worker's last dispatch against theirs: a pool freeing room is not
            # filled by every worker at once on a view up to a sync interval old.
            self._peers.exchange()
        now = self._core.clock.now()
        for model, pool in list(self.pools.items()):
            if not pool.count:
                if not self._unbound.get(model):
                    del self.pools[model]  # recreated on its next queued request
                continue
            routing = self._unbound.get(model, 0) > 0  # the last dispatch is not counted yet
            full = routing or self.saturation(model, now) >= 1.0
            preemptable = self._sheddable.get(model) and model not in self._suspending
            elsewhere = self._elsewhere(model)
            if full and not routing and preemptable:
                top = pool.top_priority()
                if top is not None:
                    self._preempt(model, top if elsewhere is None else max(top, elsewhere))
            shares = None
            if self._config.fair_share_preemption:
                top = pool.top_priority()
                band = top if elsewhere is None or top is None else max(top, elsewhere)
                if full and not routing and model not in self._suspending and band is not None:
                    self._preempt_for_share(model, band)
                shares = self._shares(model, pool)
                if not full and top is not None and band == top:
                    # Another worker holds a tenant of this band running fewer: the room is
                    # its, as a higher band's would be.
                    full = self._poorer_elsewhere(model, pool, top, shares(top), _peer_running)
                    if not full and self._reserved(model):
                        # Only a tenant running nothing may take the seats kept for one.
                        running = shares(top)
                        full = all(running.get(t, 0) for t in pool.tenants(top))
            elif self._service is not None:
                top = pool.top_priority()
                shares = self._served(model, pool, now)
                if not full and top is not None and (elsewhere is None or top >= elsewhere):
                    # Another worker holds a tenant of this band the proxy served less.
                    full = self._poorer_elsewhere(model, pool, top, shares(top), _peer_served)
            for action in pool.decide(full, now, elsewhere, shares):
                slot = self._waiters.get(action.request.seq)
                if slot is None or slot.done():
                    continue
                if isinstance(action, Reject):
                    w = action.request
                    slot.set_exception(self._refusal(w, action.reason))
                    self._observe(
                        w.tenant, w.priority, model, OUTCOMES[action.reason], now - w.arrived
                    )
                else:
                    self._unbound[model] = self._unbound.get(model, 0) + 1
                    slot.set_result(None)
        if self._peers is not None:
            self._preempt_for_peers(now)

    # --- preemption

    def _preempt_for_peers(self, now: float) -> None:
        """Another worker holds a request waiting for a full pool where this one runs
        requests and queues none (pools with a queue here were seen to above): a higher
        band's, for which a sheddable stream is suspended (`preemption`), or one of a tenant
        below its share (`fair_share_preemption`)."""
        for model in dict.fromkeys([*self._sheddable, *self._running]):
            pool = self.pools.get(model)
            if (pool is not None and pool.count) or model in self._suspending:
                continue
            elsewhere = self._elsewhere(model)
            if elsewhere is None or self._unbound.get(model):
                continue
            if self.saturation(model, now) < 1.0:
                continue
            if model in self._sheddable:
                self._preempt(model, elsewhere)
            if model in self._running and model not in self._suspending:
                self._preempt_for_share(model, elsewhere)

    def _shares(self, model: str, pool: FlowQueues) -> Callable[[int], dict[str, int]]:
        """Per band, each tenant's requests running in `model`'s pool (suspended ones not),
        in every worker. A pass over the pool's running requests: made only with
        `fair_share_preemption`, and only while requests wait."""

        def running(priority: int) -> dict[str, int]:
            return {t: len(r) for t, r in self._running_by_tenant(model, priority).items()}

        return self._whole_proxy(model, pool, running, _peer_running)

    def _served(
        self, model: str, pool: FlowQueues | None, now: float
    ) -> Callable[[int], dict[str, int]]:
        """Per band, the service each tenant received lately in `model`'s pool from every
        worker (thousandths of a request or prompt token)."""
        assert self._service is not None
        service = self._service

        def served(priority: int) -> dict[str, int]:
            memory = service.get((model, priority))
            return {t: _milli(v) for t, v in memory.items(now)} if memory is not None else {}

        return self._whole_proxy(model, pool, served, _peer_served)

    def _whole_proxy(
        self,
        model: str,
        pool: FlowQueues | None,
        own: Callable[[int], dict[str, int]],
        measure: Callable[[PeerTenant], int],
    ) -> Callable[[int], dict[str, int]]:
        """Per band, a figure per tenant (`own`: this worker's) summed with the other
        workers' (`measure` of their entries), for the tenants this worker has a figure for
        or holds waiting."""
        peers = self._peers

        @functools.cache  # a cycle asks for a band's figures more than once
        def figures(priority: int) -> dict[str, int]:
            mine = own(priority)
            for tenant in pool.tenants(priority) if pool is not None else ():
                mine.setdefault(tenant, 0)
            theirs = peers.peer_tenants(self._pool_key(model), priority) if peers else None
            if theirs:
                for tenant in mine:
                    elsewhere = theirs.get(self._tenant_key(tenant))
                    if elsewhere is not None:
                        mine[tenant] += measure(elsewhere)
            return mine

        return figures

    def _poorer_elsewhere(
        self,
        model: str,
        pool: FlowQueues,
        band: int,
        usage: Mapping[str, int],
        measure: Callable[[PeerTenant], int],
    ) -> bool:
        """Whether another worker has a tenant waiting in `band` that uses less of it in the
        whole proxy than every tenant waiting here (`usage`: the whole proxy's figure for
        the tenants this worker knows; `measure`: the same figure in a peer's entry)."""
        peers = self._peers
        if peers is None:
            return False
        theirs = peers.peer_tenants(self._pool_key(model), band)
        if not theirs:
            return False
        least_here = min(usage.get(t, 0) for t in pool.tenants(band))
        # `usage` already sums every worker for the tenants known here; a tenant of theirs
        # that is not uses only what they publish.
        whole = {self._tenant_key(t): n for t, n in usage.items()}
        return any(
            e.waiting and whole.get(key, measure(e)) < least_here for key, e in theirs.items()
        )

    def _runs_any(self, model: str, priority: int, tenant: str) -> bool:
        """Whether `tenant` runs a request in the band `priority` of `model`'s pool, in this
        worker or (as of the last sync) another."""
        if tenant in self._running_by_tenant(model, priority):
            return True
        peers = self._peers
        if peers is None:
            return False
        theirs = peers.peer_tenants(self._pool_key(model), priority).get(self._tenant_key(tenant))
        return theirs is not None and theirs.running > 0

    def _running_by_tenant(
        self, model: str, priority: int
    ) -> dict[str, list[tuple[FlowTicket, RequestContext]]]:
        running: dict[str, list[tuple[FlowTicket, RequestContext]]] = {}
        for t, ctx in self._running.get(model, {}).values():
            if t.priority == priority and t.key not in self._suspended:
                running.setdefault(t.tenant, []).append((t, ctx))
        return running

    def _preempt_for_share(self, model: str, band: int) -> None:
        """A tenant waiting in `band` (here or in another worker) runs at least two fewer
        requests there, in the whole proxy, than a tenant running some here: suspend the
        busiest such tenant's latest movable stream."""
        here = self._running_by_tenant(model, band)
        if not here:
            return
        names = {self._tenant_key(t): t for t in here}
        running = {key: len(here[t]) for key, t in names.items()}
        pool = self.pools.get(model)
        waiting = [self._tenant_key(t) for t in pool.tenants(band)] if pool is not None else []
        if self._peers is not None:
            for key, e in self._peers.peer_tenants(self._pool_key(model), band).items():
                running[key] = running.get(key, 0) + e.running
                if e.waiting:
                    waiting.append(key)
        victim = fair_share_victim(waiting, running, among=names)
        if victim is None:
            return
        # The latest to start first: it has the least to lose.
        for ticket, ctx in sorted(here[names[victim]], key=lambda r: -r[0].key):
            if self._suspend(model, ticket, ctx, FAIR_SHARE):
                log.info("request %s suspended for another tenant's share", ctx.request_id)
                return

    def _preempt(self, model: str, top: int) -> None:
        """Suspend the latest sheddable stream of a lower band than `top`, the highest one
        waiting (here or in another worker)."""
        running = [
            (t, ctx)
            for t, ctx in self._sheddable[model].values()
            if t.priority < top and t.key not in self._suspended
        ]
        # The lowest band first; in it the latest to start, which has the least to lose.
        for ticket, ctx in sorted(running, key=lambda r: (r[0].priority, -r[0].key)):
            if self._suspend(model, ticket, ctx, PRIORITY):
                log.info("request %s suspended for a priority %d request", ctx.request_id, top)
                return

    def _suspend(self, model: str, ticket: FlowTicket, ctx: RequestContext, reason: str) -> bool:
        """Suspend `ctx`'s stream, to be queued again in its band (False: not movable now)."""
        entries = self._core.live.find(ctx.request_id)
        if len(entries) != 1:
            return False  # a request id shared by several clients: not this one to guess
        entry = entries[0]
        if not entry.running or entry.movable_reason(planned=True):
            return False
        self._suspended.add(ticket.key)

        async def hold(ticket: FlowTicket = ticket, ctx: RequestContext = ctx) -> None:
            await self._requeue(model, ticket, ctx)

        task = asyncio.create_task(entry.move(None, "preempted", kind="recompute", hold=hold))
        self._suspending[model] = task
        task.add_done_callback(functools.partial(self._suspension_over, model, ticket.key))
        if self._preempted is not None:
            self._preempted.labels(model, reason).inc()
        return True

    async def _requeue(self, model: str, ticket: FlowTicket, ctx: RequestContext) -> None:
        """A suspended stream waits in its band again; raises the refusal (TTL, capacity)."""
        self._suspending.pop(model, None)  # cut: the pool may suspend another now
        now = self._core.clock.now()
        pool, w = self._waiting(model, ticket.tenant, ticket.priority, ctx, now)
        slot = self._enqueue(pool, w, model)
        try:
            await asyncio.shield(slot)  # a cancellation leaves it to _leave to dequeue
        finally:
            self._leave(pool, w, model, slot)
            self._suspended.discard(ticket.key)
        self._observe(w.tenant, w.priority, model, DISPATCHED, self._core.clock.now() - now)

    def _suspension_over(self, model: str, key: int, task: asyncio.Task[Any]) -> None:
        if self._suspending.get(model) is task:
            del self._suspending[model]
        self._suspended.discard(key)
        if not task.cancelled():
            task.exception()  # NotMovable (it ended or moved meanwhile): nothing to do

    def _forget_sheddable(self, key: int) -> None:
        for model, running in list(self._sheddable.items()):
            if running.pop(key, None) is not None:
                if not running:
                    del self._sheddable[model]
                return

    def _refusal(self, w: Waiting, reason: str) -> ProxyError:
        if reason == TTL_EXPIRED:
            ttl = self._config.band(w.priority)[0]
            why = f"waited {ttl:g} s in the flow-control queue (priority {w.priority})"
        else:
            scope = "priority band" if reason == BAND_FULL else f"tenant {w.tenant!r}'s queue"
            why = f"the {scope} at priority {w.priority} is full"
        retry = [(b"retry-after", str(self._config.retry_after).encode())]
        if w.priority < 0:  # sheddable: the client's rate, OpenAI's rate-limit shape
            return ProxyError(
                429,
                f"the model's backends are saturated and this sheddable request was shed: {why}",
                type="rate_limit_error",
                code=reason,
                headers=retry,
            )
        return ProxyError(
            503,
            f"the model's backends are saturated: {why}; retry shortly",
            type="service_unavailable",
            code=reason,
            headers=retry,
        )

    # --- what is shown

    def _bind_metrics(self, registry: CollectorRegistry) -> None:
        self._waited = Histogram(
            "llm_d_epp_flow_control_request_queue_duration_seconds",
            "Seconds a request spent in the flow-control queue, by how it left (outcome)",
            ["priority", "outcome", "model_name"],
            buckets=(0.0, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, math.inf),
            registry=registry,
        )
        self._outcomes = Counter(
            "fleet_proxy_flow_control_requests",
            "Requests through flow control by tenant, priority and how they left the queue "
            "(outcome as in the queue-duration histogram)",
            ["tenant", "priority", "outcome"],
            registry=registry,
        )
        self._preempted = Counter(
            "fleet_proxy_flow_control_preemptions",
            "Streams suspended and queued again: for a higher band's waiting request "
            "(reason priority) or for a tenant of the same band below its share (fair_share)",
            ["model_name", "reason"],
            registry=registry,
        )
        registry.register(_FlowCollector(self))

    def _observe(self, tenant: str, priority: int, model: str, outcome: str, waited: float) -> None:
        if self._waited is not None and self._outcomes is not None:
            # A number or a tenant from a header is the client's to choose: labelled only
            # when configured (or named by an API key).
            label = str(priority) if priority in self._known_priorities else "other"
            self._waited.labels(label, outcome, model).observe(waited)
            known = tenant in self._known_tenants
            self._outcomes.labels(tenant if known else "other", label, outcome).inc()

    def gauges(self) -> Iterator[tuple[str, int, float, dict[tuple[int, str], int]]]:
        """Per model served now or with requests waiting: (model, waiting, saturation,
        waiting per (priority, tenant))."""
        now = self._core.clock.now()
        models = dict.fromkeys([*self._core.fleet.models(now), *self.pools])
        for model in models:
            pool = self.pools.get(model)
            depths = pool.depths() if pool is not None else {}
            yield model, pool.count if pool is not None else 0, self.saturation(model, now), depths

    def view(self) -> dict[str, Any]:
        """`GET /admin/flow`: the configuration's gist and every pool's queues."""
        now = self._core.clock.now()
        c = self._config
        workers = self.workers_waiting()
        shared: dict[str, Any] = {}
        if workers is not None:
            # Each worker queues its own requests; these are every worker's counts (the
            # others' as of their last sync, within `peer_sync_interval`).
            shared = {
                "answered_by": self._peers.worker if self._peers is not None else 0,
                "waiting_all_workers": sum(workers.values()),
                "workers": [{"worker": w, "waiting": n} for w, n in sorted(workers.items())],
            }
        return {
            "fairness": c.fairness,
            "ordering": c.ordering,
            "waiting": len(self._waiters),
            **shared,
            "pools": {
                model: {
                    "saturation": _finite(self.saturation(model, now)),
                    "waiting": pool.count,
                    "bands": pool.view(now),
                }
                for model, pool in self.pools.items()
            },
            "attained_service": self.ordering.stats(),
            **self._served_view(now),
        }

    def _served_view(self, now: float) -> dict[str, Any]:
        """With several workers: per pool and band, what the whole proxy served each tenant
        lately (requests or prompt tokens, faded), as this worker compares them."""
        if self._service is None:
            return {}
        served: dict[str, dict[str, dict[str, float]]] = {}
        for model, priority in self._service:
            tenants = self._served(model, self.pools.get(model), now)(priority)
            served.setdefault(model, {})[str(priority)] = {
                t: round(v / 1000, 3) for t, v in sorted(tenants.items())
            }
        return {"served_lately": served}


def _milli(value: float) -> int:
    return round(value * 1000)


def _peer_running(e: PeerTenant) -> int:
    return e.running


def _peer_served(e: PeerTenant) -> int:
    return e.served


def _finite(value: float) -> float | None:
    return None if math.isinf(value) else round(value, 4)


async def _client_leaves(receive: Receive) -> None:
    # The body has been read: what receive() says next is that the client left.
    while (await receive())["type"] != "http.disconnect":
        pass


class _FlowCollector(Collector):
    """The queues at scrape time: a series per (pool, band, tenant) with requests waiting, and
    one total per pool that stays (0 when empty), for alerts."""

    def __init__(self, gate: FlowGate) -> None:
        self._gate = gate

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gate = self._gate
        size = GaugeMetricFamily(
            "llm_d_epp_flow_control_queue_size",
            "Requests waiting in the flow-control queue",
            labels=["fairness_id", "priority", "model_name"],
        )
        total = GaugeMetricFamily(
            "fleet_proxy_flow_control_waiting",
            "Requests waiting in the flow-control queue of each model's pool",
            labels=["model_name"],
        )
        saturation = GaugeMetricFamily(
            "llm_d_epp_flow_control_pool_saturation",
            "Saturation of each model's pool: the least loaded backend's load against the "
            "thresholds (1.0 or more: saturated)",
            labels=["model_name"],
        )
        workers = gate.workers_waiting()
        if workers is not None:
            per_worker = GaugeMetricFamily(
                "fleet_proxy_flow_control_waiting_workers",
                "Requests waiting in the flow-control queues of each worker process (every "
                "worker's, as the answering one sees them)",
                labels=["worker"],
            )
            for w, n in sorted(workers.items()):
                per_worker.add_metric([str(w)], n)
            yield per_worker
        for model, waiting, level, depths in gate.gauges():
            total.add_metric([model], waiting)
            saturation.add_metric([model], level if not math.isinf(level) else 1e9)
            for (priority, tenant), n in depths.items():
                size.add_metric([tenant, str(priority), model], n)
        yield size
        yield total
        yield saturation
