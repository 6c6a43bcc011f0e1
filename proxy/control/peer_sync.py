"""Keeping the proxy's worker processes in step (`--workers N`, see proxy/serving/workers.py).

Each worker runs one `PeerSync`. A step
1. applies the fleet changes (admin add / remove / drain / undrain, and discovery's add /
   update / drain / remove) appended to the shared change log since its last step, in log
   order, its own included;
2. publishes its per-backend load into its row of the shared segment;
3. reads the other workers' rows into `Load.peer_*`.

When it steps (`peer_sync_interval`, I below): a request's arrival or end steps inline once I
has passed since the last step, so a busy worker steps about every I without a timer of its
own, and the last request to leave steps at once; a timer steps 2 x I after the last step
while the worker holds requests or load (a long stream with nothing arriving), and 0.2 s
(the idle beat, or I if longer) after it when it holds none: its row is then already all
zeroes, and a request steps before it is routed once I has passed. Each timer wake-up costs
a process more than the step itself (about 200 us of CPU on a small VM against 10 us for a
step), so a worker that is idle or already woken by requests keeps its timer quiet.

The admin API changes the fleet through a `FleetChanges` (fleet/changes.py): with one worker
`LocalChanges` changes the registry directly; with several `SharedChanges` appends to the log
and answers once this worker has applied the change.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fleet.change_log import Change, ChangeLog
from fleet.changes import add_backend
from fleet.clock import IDLE_BEAT_S, Clock, SystemClock, to_next_beat
from fleet.peer_load import (
    INITIAL_GENERATION,
    PeerLoad,
    PeerTenant,
    QueueSummary,
    SlotTable,
    WorkerRow,
)
from fleet.registry import DuplicateBackend, FleetRegistry
from fleet.types import Backend, BackendSpec, Role

log = logging.getLogger("fleet_proxy.peer_sync")

Outcome = Literal["ok", "duplicate", "missing"]
NO_LOAD = PeerTenant(0, 0, 0)


def spec_to_change(spec: BackendSpec, op: str = "add") -> Change:
    return {
        "op": op,
        "spec": {
            "id": spec.id,
            "url": spec.url,
            "role": spec.role.value,
            "node": spec.node,
            "unit": spec.unit,
            "labels": dict(spec.labels),
            "models": list(spec.models),
            "source": spec.source,
            "instance": spec.instance,
            "kv_events_endpoint": spec.kv_events_endpoint,
            "kv_events_replay_endpoint": spec.kv_events_replay_endpoint,
        },
    }


def spec_from_change(data: Mapping[str, Any]) -> BackendSpec:
    return BackendSpec(
        id=str(data["id"]),
        url=str(data["url"]),
        role=Role(data["role"]),
        node=str(data["node"]),
        unit=str(data["unit"]),
        labels={str(k): str(v) for k, v in data["labels"].items()},
        models=tuple(str(m) for m in data["models"]),
        source=str(data["source"]),
        instance=str(data["instance"]),
        kv_events_endpoint=str(data.get("kv_events_endpoint", "")),
        kv_events_replay_endpoint=str(data.get("kv_events_replay_endpoint", "")),
    )


def generation_at(position: int) -> int:
    """Slot generation of a backend added by the change at `position` in the log: distinct
    from the configured backends' and from every other change's."""
    return position + INITIAL_GENERATION + 1


def apply_change(fleet: FleetRegistry, slots: SlotTable, position: int, change: Change) -> Outcome:
    """Apply one logged change. Deterministic: every worker, applying the same log in the same
    order from the same configured fleet, reaches the same registry and slot table."""
    op = change["op"]
    if op == "add":
        spec = spec_from_change(change["spec"])
        try:
            add_backend(fleet, spec)
        except DuplicateBackend:
            return "duplicate"
        if slots.assign(spec.id, generation_at(position)) is None:
            log.warning(
                "backend %s has no shared load slot (all %d taken): "
                "workers do not see each other's load on it",
                spec.id,
                slots.slots,
            )
        return "ok"
    if op == "update":
        return "missing" if fleet.update(spec_from_change(change["spec"])) is None else "ok"
    backend_id = str(change["id"])
    if op == "remove":
        if fleet.remove(backend_id) is None:
            return "missing"
        slots.release(backend_id)
        return "ok"
    if op == "drain":
        found = fleet.set_draining(backend_id, bool(change["draining"]))
        return "missing" if found is None else "ok"
    raise ValueError(f"unknown fleet change {op!r}")


# A worker rewrites its row at least every `idle_beat(interval)`; one silent for this many
# intervals, and at least a second, has stopped or is stuck.
STALE_INTERVALS = 50


def idle_beat(interval: float) -> float:
    """How often an idle worker refreshes its row (so its peers still believe it) and applies
    the change log: the process's idle beat, well inside the one second after which its peers
    stop believing it, or the interval if longer."""
    return max(interval, IDLE_BEAT_S)


def timer_delay(interval: float, busy: bool) -> float:
    """Seconds from a step to the timer's next one: within two intervals while the worker
    holds requests or load (arrivals and ends usually step it sooner), at the idle beat when
    it holds none."""
    return 2 * interval if busy else idle_beat(interval)


class PeerSync:
    """One worker's side of the shared accounting and change log."""

    def __init__(
        self,
        fleet: FleetRegistry,
        peers: PeerLoad,
        changes: ChangeLog,
        interval: float,
        clock: Clock | None = None,
        waiting: Callable[[], QueueSummary] | None = None,
    ) -> None:
        self.fleet = fleet
        # What waits in this worker's flow-control queues, published for the others.
        self.waiting = waiting
        # Per pool key, the highest band waiting in another worker, as of the last exchange.
        self._peer_tops: dict[int, int] = {}
        # Per (pool key, priority), each tenant key's loads in the other workers.
        self._peer_tenants: dict[tuple[int, int], dict[int, PeerTenant]] = {}
        # Whether any other worker had requests waiting, as of the last exchange.
        self.peers_waiting = False
        self.clock: Clock = clock or SystemClock()
        self.peers = peers
        self.changes = changes
        self.interval = interval
        self.slots = SlotTable(peers.layout.slots)
        for b in fleet:
            self.slots.assign(b.id, INITIAL_GENERATION)
        self.pid = os.getpid()
        self.ticks = 0
        # Requests inside this worker's app (`PeerTouch`), counted from arrival to end.
        self.inside = 0
        self.last_step = float("-inf")
        self._busy = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def worker(self) -> int:
        return self.peers.worker

    def apply_pending(self) -> dict[int, Outcome]:
        """Apply the changes logged since the last call; their outcomes by log position."""
        outcomes: dict[int, Outcome] = {}
        for position, change in self.changes.read_new():
            try:
                outcomes[position] = apply_change(self.fleet, self.slots, position, change)
            except (KeyError, ValueError, TypeError) as e:
                # Written by a worker of this same proxy, so only a bug gets here: skip it in
                # every worker alike rather than stop applying changes.
                log.error("skipping fleet change at %d (%r): %s", position, change, e)
                outcomes[position] = "missing"
        return outcomes

    def step(self) -> None:
        self.apply_pending()
        self.exchange()
        self.last_step = self.clock.now()

    def arrive(self) -> None:
        """A request arrived here (before it is routed)."""
        self.inside += 1
        self.touch()

    def leave(self) -> None:
        """A request ended here. The last one out steps at once: the row then says this
        worker holds nothing the moment it does, and the timer goes to the idle beat."""
        self.inside -= 1
        if self.inside == 0 and not self._closed:
            self._safe_step()
        else:
            self.touch()

    def touch(self) -> bool:
        """Step now if an interval has passed since the last step (then re-arm the timer from
        now). Whether it stepped."""
        if self._closed or self.clock.now() - self.last_step < self.interval:
            return False
        self._safe_step()
        return True

    def _safe_step(self) -> None:
        try:
            self.step()
        except Exception:  # one bad step must not end the sharing
            log.exception("peer sync step failed")
        self._arm()

    def _arm(self) -> None:
        """Set the timer's next step from the last step and what this worker holds."""
        if self._loop is None or self._closed:
            return
        if self._timer is not None:
            self._timer.cancel()
        busy = self._busy or self.inside > 0
        now = self._loop.time()
        delay = timer_delay(self.interval, busy)
        if not busy:  # on the beat, with the process's other idle timers: one wake-up
            delay = to_next_beat(now, delay)
        self._timer = self._loop.call_at(now + delay, self._safe_step)

    def exchange(self) -> None:
        """Publish this worker's load now and read the others' (every step, and between two
        steps when flow control is about to dispatch: it sees its peers' newest load, and
        they see its last dispatch, without waiting for the next step)."""
        self.ticks += 1
        backends = list(self.fleet)
        now = self.clock.now()
        stale_after = self.fleet.stale_after
        self._busy = self.peers.publish(
            backends,
            self.slots,
            pid=self.pid,
            tick=self.ticks,
            routable=sum(1 for b in backends if b.routable(now, stale_after)),
            applied=self.changes.read_to,
            waiting=self.waiting() if self.waiting is not None else None,
            now=now,
        )
        self.peers.absorb(backends, self.slots)
        if self.waiting is not None:
            self._read_peer_queues(now)

    def _read_peer_queues(self, now: float) -> None:
        """The highest band waiting per pool in the other workers, and their tenants' counts.
        A row not written for `STALE_INTERVALS` sync intervals (at least a second) is from a
        worker that stopped or is stuck: not believed, or a dead worker's queue would hold a
        pool's lower bands back for good."""
        tops: dict[int, int] = {}
        tenants: dict[tuple[int, int], dict[int, PeerTenant]] = {}
        any_waiting = False
        fresh_after = round((now - max(1.0, STALE_INTERVALS * self.interval)) * 1000)
        for r in self.peers.rows():
            if r.worker == self.worker or r.published_ms < fresh_after:
                continue
            any_waiting = any_waiting or r.waiting > 0
            if r.top_pool and (r.top_pool not in tops or r.top_priority > tops[r.top_pool]):
                tops[r.top_pool] = r.top_priority
            for e in r.tenants:
                band = tenants.setdefault((e.pool, e.priority), {})
                running, waiting, served = band.get(e.tenant, NO_LOAD)
                band[e.tenant] = PeerTenant(
                    running + e.running, waiting + e.waiting, served + e.served
                )
        self._peer_tops = tops
        self._peer_tenants = tenants
        self.peers_waiting = any_waiting

    def peer_tenants(self, pool: int, priority: int) -> Mapping[int, PeerTenant]:
        """Per tenant key, its loads in the band `priority` of `pool` in the other workers, as
        of the last exchange (the tenants they publish)."""
        return self._peer_tenants.get((pool, priority), {})

    def peer_top(self, pool: int) -> int | None:
        """The highest band waiting for `pool` (a `pool_key`) in another worker; None when
        none waits there."""
        return self._peer_tops.get(pool)

    async def run(self) -> None:
        """Step by the timer and `touch` until cancelled (the first step is the caller's, before
        the first request); then clear this worker's row."""
        self._loop = asyncio.get_running_loop()
        try:
            self._arm()
            await asyncio.Event().wait()  # the timer and the requests' touches do the work
        finally:
            self._closed = True
            if self._timer is not None:
                self._timer.cancel()
            self.peers.clear_own_row()

    def submit(self, change: Change) -> Outcome:
        """Log `change`, apply the log up to it here and now, and say how it went."""
        position = self.changes.append(change)
        # No await between the append and here: nothing else in this worker reads the log
        # meanwhile, so the change is among those applied now.
        return self.apply_pending()[position]

    def rows(self) -> list[WorkerRow]:
        return self.peers.rows()

    def waiting_rows(self) -> list[tuple[int, int]]:
        """(worker, requests waiting in its flow-control queues) of every worker."""
        return [(r.worker, r.waiting) for r in self.peers.rows()]

    def close(self) -> None:
        self._closed = True
        self.changes.close()
        self.peers.close()


class SharedChanges:
    """Several workers: every change goes through the shared log."""

    def __init__(self, sync: PeerSync) -> None:
        self.sync = sync
        self.fleet = sync.fleet

    async def add(self, spec: BackendSpec) -> Backend:
        if self.sync.submit(spec_to_change(spec)) == "duplicate":
            raise DuplicateBackend(f"backend {spec.id!r} is already registered")
        backend = self.fleet.get(spec.id)
        assert backend is not None  # just added here, and nothing awaited since
        return backend

    async def remove(self, backend_id: str) -> Backend | None:
        self.sync.apply_pending()  # so a backend another worker just added is found
        backend = self.fleet.get(backend_id)
        if self.sync.submit({"op": "remove", "id": backend_id}) != "ok":
            return None
        return backend

    async def set_draining(self, backend_id: str, draining: bool) -> Backend | None:
        if self.sync.submit({"op": "drain", "id": backend_id, "draining": draining}) != "ok":
            return None
        return self.fleet.get(backend_id)

    async def update(self, spec: BackendSpec) -> Backend | None:
        if self.sync.submit(spec_to_change(spec, "update")) != "ok":
            return None
        return self.fleet.get(spec.id)


@dataclass(frozen=True, slots=True)
class WorkerSeat:
    """What a worker process is told by the supervisor: which row is its own, and where the
    shared segment, change log, rate-limit table and the boards of metrics and health
    verdicts (empty: none, every worker polls every backend itself) are."""

    index: int
    count: int
    segment: str
    change_log: str
    metrics_board: str = ""
    health_board: str = ""
    rate_table: str | None = None  # flowcontrol/rate_table.py's file, every worker's buckets
