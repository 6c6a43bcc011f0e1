"""Per-backend load shared between the proxy's worker processes (`--workers N`).

One shared-memory segment (created by the supervisor, proxy/serving/workers.py) holds a row per
worker; a row holds, per backend slot, what that worker has in flight on the backend. Each
worker writes only its own row and reads the others into `Load.peer_*`, so a policy in any
worker sees the requests its peers have sent too.

Layout, all native int64 (aligned 8-byte stores, so a reader never sees half a number; it may
see one cell newer than the next, which a load estimate tolerates):

    header:  MAGIC, VERSION, workers, slots
    row w:   pid, dispatched, ticks, routable, applied, waiting, top_priority, top_pool,
             published_ms, 0,
             8 tenant entries: pool, priority, tenant, running, waiting, served
             (tenant 0: unused),
             then per slot: generation, in_flight, pending, decodes

(`routable`: backends the worker can route to; `applied`: how far into the change log it has
applied fleet changes. Both let an operator or a test see that every worker is in step.
`waiting`: requests held in the worker's flow-control queues, so any worker can show them all;
`top_priority` and `top_pool`: the highest band waiting there and its pool's `pool_key` (0: none
waits), so a worker leaves a pool's room to a higher band waiting in another; `published_ms`:
when the row was last written, on the system-wide monotonic clock, so a row nobody updates any
more is not believed. The tenant entries: the requests each tenant runs (with fair-share
preemption) and has waiting in a band of a pool in this worker, and the service it received
there lately (`served`, in thousandths of a request or of a prompt token, decaying; without
fair-share preemption), those with requests waiting first, so every worker compares tenants
by what the whole proxy runs for them or served them.)

A slot is keyed by backend id in `SlotTable`. Every worker builds the same table without talking to
the others: the configured backends take slots 0.. in order, and later admin changes are applied by
every worker in the order of the shared change log (proxy/control/peer_sync.py), each add taking the
lowest free slot. The generation (1 for configured backends, a change's log position + 2 for added
ones) tells a reused slot's new backend from its old one while some worker has not yet applied the
change: cells of another generation are not counted.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Iterable, MutableSequence, Sequence
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import NamedTuple

from fleet.types import Backend

MAGIC = 0x466C656574506565  # "FleetPee"
VERSION = 4
HEADER = 4
TENANT_ENTRIES = 8
ENTRY = 6
TENANTS_AT = 10  # where a row's tenant entries start
ROW_HEADER = TENANTS_AT + TENANT_ENTRIES * ENTRY
CELL = 4
INITIAL_GENERATION = 1
DEFAULT_SLOTS = 512

# Offsets inside a row header and a cell.
PID, DISPATCHED, TICKS, ROUTABLE, APPLIED, WAITING = 0, 1, 2, 3, 4, 5
TOP_PRIORITY, TOP_POOL, PUBLISHED_MS = 6, 7, 8
GENERATION, IN_FLIGHT, PENDING, DECODES = 0, 1, 2, 3
E_POOL, E_PRIORITY, E_TENANT, E_RUNNING, E_WAITING, E_SERVED = 0, 1, 2, 3, 4, 5


class LayoutMismatch(RuntimeError):
    pass


@dataclass(frozen=True, slots=True)
class PeerLayout:
    workers: int
    slots: int = DEFAULT_SLOTS

    @property
    def row_len(self) -> int:
        return ROW_HEADER + self.slots * CELL

    @property
    def words(self) -> int:
        return HEADER + self.workers * self.row_len

    @property
    def size_bytes(self) -> int:
        return self.words * 8

    def row(self, worker: int) -> int:
        """Index of worker's row header in the int64 array."""
        if not 0 <= worker < self.workers:
            raise IndexError(f"worker {worker} outside 0..{self.workers - 1}")
        return HEADER + worker * self.row_len

    def cell(self, worker: int, slot: int) -> int:
        """Index of the first word (generation) of worker's cell for slot."""
        if not 0 <= slot < self.slots:
            raise IndexError(f"slot {slot} outside 0..{self.slots - 1}")
        return self.row(worker) + ROW_HEADER + slot * CELL


def write_header(words: MutableSequence[int] | memoryview, layout: PeerLayout) -> None:
    for i, value in enumerate((MAGIC, VERSION, layout.workers, layout.slots)):
        words[i] = value


def read_layout(words: Sequence[int]) -> PeerLayout:
    if words[0] != MAGIC or words[1] != VERSION:
        raise LayoutMismatch("shared segment is not a fleet-proxy peer-load segment")
    return PeerLayout(workers=int(words[2]), slots=int(words[3]))


def peer_sums(
    words: Sequence[int], layout: PeerLayout, own: int, slot: int, generation: int
) -> tuple[int, int, int]:
    """(in_flight, pending prefill tokens, running decodes) of every worker but `own` on
    `slot`, counting only cells of `generation`."""
    in_flight = pending = decodes = 0
    for w in range(layout.workers):
        if w == own:
            continue
        i = layout.cell(w, slot)
        if words[i + GENERATION] != generation:
            continue
        in_flight += words[i + IN_FLIGHT]
        pending += words[i + PENDING]
        decodes += words[i + DECODES]
    return in_flight, pending, decodes


class SlotTable:
    """Backend id -> (slot, generation); an add takes the lowest free slot."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._by_id: dict[str, tuple[int, int]] = {}
        self._used: set[int] = set()

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, backend_id: str) -> tuple[int, int] | None:
        return self._by_id.get(backend_id)

    def assign(self, backend_id: str, generation: int) -> int | None:
        """The slot given to backend_id, or None when every slot is taken."""
        if backend_id in self._by_id:
            return self._by_id[backend_id][0]
        for slot in range(self.slots):
            if slot not in self._used:
                self._used.add(slot)
                self._by_id[backend_id] = (slot, generation)
                return slot
        return None

    def release(self, backend_id: str) -> int | None:
        entry = self._by_id.pop(backend_id, None)
        if entry is None:
            return None
        self._used.discard(entry[0])
        return entry[0]

    def items(self) -> list[tuple[str, int, int]]:
        return [(bid, slot, gen) for bid, (slot, gen) in self._by_id.items()]


@dataclass(frozen=True, slots=True)
class WorkerRow:
    worker: int
    pid: int
    dispatched: int
    ticks: int
    routable: int
    applied: int
    waiting: int = 0
    top_priority: int = 0
    top_pool: int = 0  # 0: nothing waits
    published_ms: int = 0
    tenants: tuple[TenantLoad, ...] = ()


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """A tenant's requests in one band of one pool of a worker: running, and waiting there,
    and the service it received there lately (`served`: thousandths of a request or of a
    prompt token, as the fairness policy counts them, decaying with time)."""

    pool: int  # pool_key
    priority: int
    tenant: int  # tenant_key
    running: int
    waiting: int
    served: int = 0


class PeerTenant(NamedTuple):
    """A tenant's loads in one band of one pool, summed over the other workers."""

    running: int
    waiting: int
    served: int  # thousandths, decaying: see `TenantLoad`


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """What a worker's flow-control queues hold, as the others see it: how many wait, the
    highest band waiting with its pool's `pool_key` (0: none), and up to `TENANT_ENTRIES`
    tenants' loads, those with requests waiting first."""

    count: int = 0
    top_priority: int = 0
    top_pool: int = 0
    tenants: tuple[TenantLoad, ...] = ()


def pool_key(model: str) -> int:
    """A model pool's id in the shared rows: the same in every process (unlike `hash`),
    never 0, and fits an int64."""
    return _key(b"pool:" + model.encode())


def tenant_key(tenant: str) -> int:
    """A tenant's id in the shared rows, as `pool_key`."""
    return _key(b"tenant:" + tenant.encode())


def _key(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=7).digest(), "big") + 1


class PeerSegment:
    """The shared segment's lifetime: created and finally unlinked by the supervisor.

    Workers attach by name (`PeerLoad.attach`). They are started by multiprocessing from the
    supervisor and so share its resource tracker, where the segment stays registered once
    until the supervisor unlinks it; a worker dying does not take the segment with it.
    """

    def __init__(self, layout: PeerLayout) -> None:
        self.layout = layout
        self._shm = SharedMemory(create=True, size=layout.size_bytes)
        words = _words(self._shm)
        write_header(words, layout)  # a new segment is zero-filled
        words.release()

    @property
    def name(self) -> str:
        return self._shm.name

    def close(self) -> None:
        self._shm.close()
        self._shm.unlink()


class PeerLoad:
    """One worker's view of the shared segment: writes its own row, reads the others."""

    def __init__(self, shm: SharedMemory, worker: int) -> None:
        self._shm = shm
        self.words = _words(shm)
        self.layout = read_layout(self.words)
        self.layout.row(worker)  # validates the index
        self.worker = worker
        self._written: set[int] = set()

    @classmethod
    def attach(cls, name: str, worker: int) -> PeerLoad:
        return cls(SharedMemory(name=name), worker)

    def publish(
        self,
        backends: Iterable[Backend],
        slots: SlotTable,
        *,
        pid: int,
        tick: int,
        routable: int = 0,
        applied: int = 0,
        waiting: QueueSummary | None = None,
        now: float = 0.0,
    ) -> bool:
        """Write this worker's row: every slotted backend's own load, and zeroes for the
        slots it wrote last time whose backend has gone. `now`: the monotonic clock, in
        seconds. Whether the row holds anything: a backend's load or a waiting request."""
        words, layout, own = self.words, self.layout, self.worker
        row = layout.row(own)
        dispatched = 0
        holds = False
        written: set[int] = set()
        for b in backends:
            load = b.load
            dispatched += load.dispatched_total
            entry = slots.get(b.id)
            if entry is None:
                continue
            slot, generation = entry
            i = layout.cell(own, slot)
            words[i + GENERATION] = generation
            words[i + IN_FLIGHT] = load.in_flight
            words[i + PENDING] = load.pending_prefill_tokens
            words[i + DECODES] = load.running_decodes
            holds = holds or bool(load.in_flight or load.pending_prefill_tokens)
            written.add(slot)
        for slot in self._written - written:
            i = layout.cell(own, slot)
            words[i : i + CELL] = _ZERO_CELL
        self._written = written
        words[row + PID] = pid
        words[row + DISPATCHED] = dispatched
        words[row + TICKS] = tick
        words[row + ROUTABLE] = routable
        words[row + APPLIED] = applied
        queues = waiting or QueueSummary()
        words[row + WAITING] = queues.count
        words[row + TOP_PRIORITY] = queues.top_priority
        words[row + TOP_POOL] = queues.top_pool
        entries = queues.tenants[:TENANT_ENTRIES]
        at = row + TENANTS_AT
        for e in entries:
            words[at : at + ENTRY] = _entry(e)
            at += ENTRY
        end = row + TENANTS_AT + TENANT_ENTRIES * ENTRY
        if at < end:
            words[at:end] = _zeros(end - at)
        words[row + PUBLISHED_MS] = round(now * 1000)
        return holds or queues.count > 0

    def absorb(self, backends: Iterable[Backend], slots: SlotTable) -> None:
        """Set every backend's `Load.peer_*` from the other workers' rows."""
        words, layout, own = self.words, self.layout, self.worker
        for b in backends:
            load = b.load
            entry = slots.get(b.id)
            if entry is None:
                load.peer_in_flight = 0
                load.peer_pending_prefill_tokens = 0
                load.peer_running_decodes = 0
                continue
            in_flight, pending, decodes = peer_sums(words, layout, own, entry[0], entry[1])
            load.peer_in_flight = in_flight
            load.peer_pending_prefill_tokens = pending
            load.peer_running_decodes = decodes

    def clear_own_row(self) -> None:
        start = self.layout.row(self.worker)
        self.words[start : start + self.layout.row_len] = _zeros(self.layout.row_len)
        self._written = set()

    def rows(self) -> list[WorkerRow]:
        words, layout = self.words, self.layout
        return [
            WorkerRow(
                w,
                pid=words[r + PID],
                dispatched=words[r + DISPATCHED],
                ticks=words[r + TICKS],
                routable=words[r + ROUTABLE],
                applied=words[r + APPLIED],
                waiting=words[r + WAITING],
                top_priority=words[r + TOP_PRIORITY],
                top_pool=words[r + TOP_POOL],
                published_ms=words[r + PUBLISHED_MS],
                tenants=_tenants(words, r),
            )
            for w in range(layout.workers)
            for r in (layout.row(w),)
        ]

    def close(self) -> None:
        self.words.release()
        self._shm.close()


def _entry(e: TenantLoad) -> memoryview:
    return memoryview(array("q", (e.pool, e.priority, e.tenant, e.running, e.waiting, e.served)))


def _tenants(words: Sequence[int], row: int) -> tuple[TenantLoad, ...]:
    out: list[TenantLoad] = []
    for n in range(TENANT_ENTRIES):
        i = row + TENANTS_AT + n * ENTRY
        if words[i + E_TENANT]:
            out.append(
                TenantLoad(
                    words[i + E_POOL],
                    words[i + E_PRIORITY],
                    words[i + E_TENANT],
                    words[i + E_RUNNING],
                    words[i + E_WAITING],
                    words[i + E_SERVED],
                )
            )
    return tuple(out)


def _words(shm: SharedMemory) -> memoryview:
    buf = shm.buf
    if buf is None:
        raise ValueError(f"shared memory {shm.name} is closed")
    return buf.cast("q")


def _zeros(n: int) -> memoryview:
    return memoryview(bytes(8 * n)).cast("q")


_ZERO_CELL = _zeros(CELL)
