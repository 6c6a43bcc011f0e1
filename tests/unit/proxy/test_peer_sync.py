"""Two workers' PeerSync on one real segment and change log: fleet changes reach both in one
order, with the same slots, and each sees the other's load."""

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleet.change_log import ChangeLog
from fleet.clock import FakeClock
from fleet.peer_load import (
    TENANT_ENTRIES,
    PeerLayout,
    PeerLoad,
    PeerSegment,
    PeerTenant,
    QueueSummary,
    TenantLoad,
    pool_key,
    tenant_key,
)
from fleet.registry import DuplicateBackend, FleetRegistry
from fleet.types import BackendSpec, Role
from policies.loads import in_flight
from proxy.control.peer_sync import PeerSync, SharedChanges, spec_from_change, spec_to_change


def registry(*ids: str) -> FleetRegistry:
    fleet = FleetRegistry(stale_after=1.0)
    for i in ids:
        fleet.add(BackendSpec(id=i, url=f"http://{i}"))
    return fleet


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[PeerSync, PeerSync]]:
    segment = PeerSegment(PeerLayout(workers=2, slots=8))
    path = tmp_path / "changes.jsonl"
    syncs = tuple(
        PeerSync(registry("a", "b"), PeerLoad.attach(segment.name, w), ChangeLog(path), 0.02)
        for w in (0, 1)
    )
    yield syncs[0], syncs[1]
    for s in syncs:
        s.close()
    segment.close()


def test_spec_survives_the_log() -> None:
    spec = BackendSpec(
        id="x", url="http://x:1", role=Role.DECODE, node="n", unit="u", labels={"k": "v"},
        models=("m",), kv_events_endpoint="tcp://x:5557", kv_events_replay_endpoint="tcp://x:5558",
    )  # fmt: skip
    assert spec_from_change(spec_to_change(spec)["spec"]) == spec


async def test_changes_reach_both_workers_with_the_same_slots(
    pair: tuple[PeerSync, PeerSync],
) -> None:
    s0, s1 = pair
    c0, c1 = SharedChanges(s0), SharedChanges(s1)
    added = await c0.add(BackendSpec(id="c", url="http://c"))
    # Applied by the receiving worker before the call returns; not yet routable (no checks).
    assert s0.fleet.get("c") is added and not added.healthy
    assert s1.fleet.get("c") is None
    s1.step()
    c_in_1 = s1.fleet.get("c")
    assert c_in_1 is not None and not c_in_1.healthy

    assert await c1.set_draining("a", True) is not None
    s0.step()
    a0 = s0.fleet.get("a")
    assert a0 is not None and a0.draining

    assert await c1.remove("b") is not None
    assert await c0.remove("b") is None  # already gone once the log is applied
    await c0.add(BackendSpec(id="d", url="http://d"))  # takes b's freed slot
    s1.step()
    assert [b.id for b in s0.fleet] == [b.id for b in s1.fleet] == ["a", "c", "d"]
    assert s0.slots.items() == s1.slots.items()
    assert s0.slots.get("d") is not None and s0.slots.get("d")[0] == 1  # type: ignore[index]

    with pytest.raises(DuplicateBackend):
        await c1.add(BackendSpec(id="d", url="http://elsewhere"))
    assert await c1.set_draining("nope", True) is None


async def test_each_worker_sees_the_others_in_flight(pair: tuple[PeerSync, PeerSync]) -> None:
    s0, s1 = pair
    a0 = s0.fleet.get("a")
    assert a0 is not None
    a0.load.in_flight = 6
    s0.step()
    s1.step()
    a1 = s1.fleet.get("a")
    assert a1 is not None
    assert (a1.load.in_flight, in_flight(a1)) == (0, 6)
    # ...and still after "a" is removed and added again: a new generation in the same slot.
    await SharedChanges(s1).remove("a")
    await SharedChanges(s1).add(BackendSpec(id="a", url="http://a"))
    s0.step()  # worker 0 applies both changes: its new "a" starts at 0 in flight
    s1.step()
    a1 = s1.fleet.get("a")
    assert a1 is not None and in_flight(a1) == 0
    a0 = s0.fleet.get("a")
    assert a0 is not None
    a0.load.in_flight = 2
    s0.step()
    s1.step()
    assert in_flight(a1) == 2


Three = tuple[list[PeerSync], dict[int, QueueSummary], FakeClock]


@pytest.fixture
def three(tmp_path: Path) -> Iterator[Three]:
    """Three workers' PeerSync on one segment, on a fake clock; worker w publishes
    `queues[w]` as what waits in its flow-control queues."""
    segment = PeerSegment(PeerLayout(workers=3, slots=8))
    clock = FakeClock(100.0)
    queues = {w: QueueSummary() for w in range(3)}
    log = tmp_path / "log"
    syncs = [
        PeerSync(
            registry("a"),
            PeerLoad.attach(segment.name, w),
            ChangeLog(log),
            0.02,
            clock,
            summary_of(queues, w),
        )
        for w in range(3)
    ]
    yield syncs, queues, clock
    for s in syncs:
        s.close()
    segment.close()


def summary_of(queues: dict[int, QueueSummary], worker: int) -> Callable[[], QueueSummary]:
    return lambda: queues[worker]


def test_a_worker_sees_the_highest_band_queued_in_another_until_its_row_goes_stale(
    three: Three,
) -> None:
    syncs, queues, clock = three
    x, y = pool_key("model-x"), pool_key("model-y")
    assert x != y and pool_key("model-x") == x and 0 < x < 2**63
    queues[1] = QueueSummary(4, top_priority=5, top_pool=x)
    queues[2] = QueueSummary(1, top_priority=9, top_pool=y)
    for s in [*syncs, *syncs]:  # the second round reads what all published in the first
        s.exchange()
    assert [syncs[0].peer_top(x), syncs[0].peer_top(y)] == [5, 9]
    assert syncs[1].peer_top(x) is None  # its own queue is not "elsewhere"
    assert syncs[1].peer_top(y) == 9
    assert syncs[0].peers_waiting and syncs[1].peers_waiting  # worker 2 waits for both
    # Worker 2 stops publishing: after a second its row no longer holds the others back.
    clock.advance(0.5)
    syncs[0].exchange()
    syncs[1].exchange()
    assert syncs[0].peer_top(y) == 9
    clock.advance(0.6)
    syncs[0].exchange()
    syncs[1].exchange()
    assert syncs[0].peer_top(y) is None and syncs[0].peer_top(x) == 5
    queues[1] = QueueSummary()  # worker 1's queue emptied
    syncs[1].exchange()
    syncs[0].exchange()
    assert syncs[0].peer_top(x) is None
    assert not syncs[0].peers_waiting  # worker 2's row is stale, worker 1's queue empty


def test_tenants_running_and_waiting_in_the_other_workers_are_summed_per_band(
    three: Three,
) -> None:
    syncs, queues, clock = three
    x = pool_key("model-x")
    quiet, noisy = tenant_key("quiet"), tenant_key("noisy")
    assert quiet != noisy and 0 < quiet < 2**63 and quiet != pool_key("quiet")
    queues[1] = QueueSummary(
        1, 0, x, (TenantLoad(x, 0, quiet, 0, 1, 500), TenantLoad(x, 0, noisy, 3, 0, 9_000))
    )
    queues[2] = QueueSummary(
        0, 0, 0, (TenantLoad(x, 0, noisy, 4, 0, 1_250), TenantLoad(x, -1, noisy, 2, 0))
    )
    for s in [*syncs, *syncs]:
        s.exchange()
    # (running, waiting, served) summed over the other workers.
    assert dict(syncs[0].peer_tenants(x, 0)) == {
        quiet: PeerTenant(0, 1, 500),
        noisy: PeerTenant(7, 0, 10_250),
    }
    assert dict(syncs[0].peer_tenants(x, -1)) == {noisy: PeerTenant(2, 0, 0)}
    assert dict(syncs[1].peer_tenants(x, 0)) == {noisy: PeerTenant(4, 0, 1_250)}  # not its own
    # Only the first TENANT_ENTRIES of a worker's tenants are published.
    many = tuple(TenantLoad(x, 0, tenant_key(f"t{i}"), 1, 0) for i in range(20))
    queues[2] = QueueSummary(0, 0, 0, many)
    syncs[2].exchange()
    syncs[0].exchange()
    assert len(syncs[0].peer_tenants(x, 0)) == TENANT_ENTRIES + 2  # and worker 1's two
    # A row not written for a second is not believed.
    clock.advance(1.1)
    syncs[0].exchange()
    assert syncs[0].peer_tenants(x, 0) == {}
