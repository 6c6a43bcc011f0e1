"""Shared per-backend load between worker processes: layout arithmetic, slots, and two
workers' views of one real shared-memory segment."""

from collections.abc import Iterator

import pytest

from fleet.peer_load import (
    CELL,
    HEADER,
    INITIAL_GENERATION,
    ROW_HEADER,
    LayoutMismatch,
    PeerLayout,
    PeerLoad,
    PeerSegment,
    QueueSummary,
    SlotTable,
    peer_sums,
    read_layout,
    write_header,
)
from fleet.types import Backend, BackendSpec
from policies.loads import (
    batch_size,
    in_flight,
    pending_prefill_tokens,
    queue_size,
    running_decodes,
)


def test_layout_cells_do_not_overlap_and_fill_the_segment() -> None:
    layout = PeerLayout(workers=3, slots=5)
    seen: set[int] = set()
    for w in range(3):
        row = layout.row(w)
        seen.update(range(row, row + ROW_HEADER))
        for s in range(5):
            i = layout.cell(w, s)
            assert not seen & set(range(i, i + CELL))
            seen.update(range(i, i + CELL))
    assert seen == set(range(HEADER, layout.words))
    assert layout.size_bytes == 8 * (HEADER + 3 * (ROW_HEADER + 5 * CELL))
    with pytest.raises(IndexError):
        layout.row(3)
    with pytest.raises(IndexError):
        layout.cell(0, 5)


def test_header_round_trips_and_rejects_foreign_memory() -> None:
    words = [0] * 8
    write_header(words, PeerLayout(workers=4, slots=16))
    assert read_layout(words) == PeerLayout(workers=4, slots=16)
    with pytest.raises(LayoutMismatch):
        read_layout([0] * 8)


def test_peer_sums_skip_own_row_and_other_generations() -> None:
    layout = PeerLayout(workers=3, slots=2)
    words = [0] * layout.words
    for w, (gen, n, pending, dec) in enumerate([(7, 1, 10, 1), (7, 2, 20, 0), (6, 5, 50, 5)]):
        i = layout.cell(w, 1)
        words[i : i + CELL] = [gen, n, pending, dec]
    # Worker 0 sees worker 1 only: worker 2's cell is an older backend in that slot.
    assert peer_sums(words, layout, own=0, slot=1, generation=7) == (2, 20, 0)
    assert peer_sums(words, layout, own=1, slot=1, generation=7) == (1, 10, 1)
    assert peer_sums(words, layout, own=0, slot=0, generation=7) == (0, 0, 0)


def test_slot_table_takes_the_lowest_free_slot_and_runs_out() -> None:
    t = SlotTable(3)
    assert [t.assign(b, 1) for b in "abc"] == [0, 1, 2]
    assert t.assign("d", 5) is None
    assert t.assign("b", 9) == 1  # already there: same slot, generation kept
    assert t.get("b") == (1, 1)
    assert t.release("a") == 0
    assert t.release("a") is None
    assert t.assign("d", 5) == 0
    assert t.get("d") == (0, 5)
    assert len(t) == 3


def backends(*ids: str) -> list[Backend]:
    return [Backend(BackendSpec(id=i, url=f"http://{i}")) for i in ids]


@pytest.fixture
def segment() -> Iterator[PeerSegment]:
    seg = PeerSegment(PeerLayout(workers=2, slots=4))
    yield seg
    seg.close()


def test_two_workers_see_each_others_load(segment: PeerSegment) -> None:
    w0, w1 = PeerLoad.attach(segment.name, 0), PeerLoad.attach(segment.name, 1)
    slots = SlotTable(4)
    for bid in ("a", "b"):
        slots.assign(bid, INITIAL_GENERATION)
    fleet0, fleet1 = backends("a", "b"), backends("a", "b")
    fleet0[0].load.in_flight = 3
    fleet0[0].load.pending_prefill_tokens = 300
    fleet0[0].load.running_decodes = 1
    fleet0[0].load.dispatched_total = 9
    fleet1[1].load.in_flight = 2

    w0.publish(fleet0, slots, pid=100, tick=1, routable=2, applied=70)
    w1.publish(fleet1, slots, pid=101, tick=1)
    w1.absorb(fleet1, slots)
    w0.absorb(fleet0, slots)

    a1, b1 = fleet1
    assert (a1.load.in_flight, a1.load.peer_in_flight) == (0, 3)
    assert in_flight(a1) == 3
    assert pending_prefill_tokens(a1) == 300
    assert running_decodes(a1) == 1
    assert queue_size(a1) == 2  # in flight, not yet decoding, over both workers
    assert batch_size(a1) == 3
    assert b1.load.peer_in_flight == 0
    assert fleet0[1].load.peer_in_flight == 2
    assert fleet0[0].load.peer_in_flight == 0  # its own count is not counted twice
    rows = [(r.worker, r.pid, r.dispatched, r.routable, r.applied) for r in w1.rows()]
    assert rows == [(0, 100, 9, 2, 70), (1, 101, 0, 0, 0)]
    w0.close()
    w1.close()


@pytest.fixture
def busy_a(segment: PeerSegment) -> Iterator[tuple[PeerLoad, PeerLoad, SlotTable, Backend]]:
    """Worker 0 has published 4 requests in flight on backend "a"; worker 1 has its own "a"."""
    w0, w1 = PeerLoad.attach(segment.name, 0), PeerLoad.attach(segment.name, 1)
    slots = SlotTable(4)
    slots.assign("a", INITIAL_GENERATION)
    (a0,) = backends("a")
    a0.load.in_flight = 4
    w0.publish([a0], slots, pid=1, tick=1)
    (a1,) = backends("a")
    w1.absorb([a1], slots)
    assert a1.load.peer_in_flight == 4
    yield w0, w1, slots, a1
    w0.close()
    w1.close()


def test_a_removed_backend_leaves_no_load_behind(
    busy_a: tuple[PeerLoad, PeerLoad, SlotTable, Backend],
) -> None:
    w0, w1, slots, a1 = busy_a
    # Worker 0 removes "a" and a new backend takes its slot in a later generation.
    slots.release("a")
    slots.assign("z", 42)
    w0.publish([], slots, pid=1, tick=2)
    w1.absorb([a1], slots)
    assert a1.load.peer_in_flight == 0  # "a" has no slot any more
    (z,) = backends("z")
    w1.absorb([z], slots)
    assert z.load.peer_in_flight == 0  # the old cell was cleared, not inherited


def test_stopping_worker_clears_its_row(
    busy_a: tuple[PeerLoad, PeerLoad, SlotTable, Backend],
) -> None:
    w0, w1, slots, a1 = busy_a
    w0.clear_own_row()
    w1.absorb([a1], slots)
    assert a1.load.peer_in_flight == 0
    assert w1.rows()[0].pid == 0


def test_publish_says_whether_the_row_holds_load_or_waiting_requests(
    segment: PeerSegment,
) -> None:
    w0 = PeerLoad.attach(segment.name, 0)
    slots = SlotTable(4)
    slots.assign("a", INITIAL_GENERATION)
    (a,) = backends("a")
    a.load.dispatched_total = 5  # served earlier: nothing held now
    assert w0.publish([a], slots, pid=1, tick=1) is False
    a.load.in_flight = 1
    assert w0.publish([a], slots, pid=1, tick=2) is True
    a.load.in_flight = 0
    a.load.pending_prefill_tokens = 40
    assert w0.publish([a], slots, pid=1, tick=3) is True
    a.load.pending_prefill_tokens = 0
    assert w0.publish([a], slots, pid=1, tick=4, waiting=QueueSummary(count=2)) is True
    assert w0.publish([a], slots, pid=1, tick=5) is False
    w0.close()
