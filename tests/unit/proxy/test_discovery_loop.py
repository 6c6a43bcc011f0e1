"""The discovery loop on a real ProxyCore: a source's desired sets become registry changes
through FleetChanges, a gone backend is drained and removed only once its requests are done,
a replacement waits for it; with two workers the changes reach both through the change log."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.change_log import ChangeLog
from fleet.changes import LocalChanges
from fleet.discovery import KUBERNETES, STATIC, Desired, Publish
from fleet.peer_load import PeerLayout, PeerLoad, PeerSegment
from fleet.registry import FleetRegistry
from fleet.types import Backend, BackendSpec, Role
from proxy.control.discovery_loop import DiscoveryLoop
from proxy.control.peer_sync import PeerSync, SharedChanges
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings
from tests.support.polling import eventually


class HandSource:
    """Publishes what the test gives it."""

    name = KUBERNETES

    async def run(self, publish: Publish) -> None:
        await asyncio.Event().wait()


def pod(name: str, ip: str = "10.0.0.1", uid: str = "u1", **kw: object) -> BackendSpec:
    return replace(BackendSpec(id=name, url=f"http://{ip}:8000", instance=uid), **kw)


def want(*specs: BackendSpec) -> Desired:
    return {s.id: s for s in specs}


async def added(core: ProxyCore, loop: DiscoveryLoop, spec: BackendSpec) -> Backend:
    loop.publish(want(spec))
    await eventually(lambda: core.fleet.get(spec.id) is not None)
    backend = core.fleet.get(spec.id)
    assert backend is not None
    return backend


@pytest.fixture
def core() -> ProxyCore:
    return ProxyCore(load_settings({"backends": ["http://127.0.0.1:9"]}))


@pytest.fixture
async def loop(core: ProxyCore) -> AsyncIterator[DiscoveryLoop]:
    d = DiscoveryLoop(core, LocalChanges(core.fleet), HandSource(), drain_timeout=30)
    task = asyncio.create_task(d.run())
    yield d
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wanted_backends_are_added_and_other_sources_kept(
    core: ProxyCore, loop: DiscoveryLoop
) -> None:
    loop.publish(want(pod("p1"), pod("p2", "10.0.0.2")))
    await eventually(lambda: core.fleet.get("p2") is not None)
    p1 = core.fleet.get("p1")
    assert p1 is not None and p1.spec.source == KUBERNETES
    assert not p1.healthy  # not routable before its first health check
    loop.publish({})
    await eventually(lambda: len(core.fleet) == 1)
    assert [b.spec.source for b in core.fleet] == [STATIC]


async def test_a_gone_backend_drains_and_leaves_once_its_requests_are_done(
    core: ProxyCore, loop: DiscoveryLoop
) -> None:
    old = await added(core, loop, pod("p1"))
    old.load.in_flight = 1  # a request that cannot move
    # The pod is recreated under the same name: the old backend must leave first.
    loop.publish(want(pod("p1", uid="u2")))
    await eventually(lambda: old.draining)
    assert loop.leaving() == ["p1"] and core.fleet.get("p1") is old
    old.load.in_flight = 0
    await eventually(lambda: (b := core.fleet.get("p1")) is not None and b is not old)
    new = core.fleet.get("p1")
    assert new is not None and new.spec.instance == "u2" and not new.draining
    assert loop.leaving() == []


async def test_a_changed_role_updates_the_backend_in_place(
    core: ProxyCore, loop: DiscoveryLoop
) -> None:
    before = await added(core, loop, pod("p1"))
    before.load.dispatched_total = 7
    loop.publish(want(pod("p1", role=Role.DECODE)))
    await eventually(lambda: before.role is Role.DECODE)
    assert core.fleet.get("p1") is before and before.load.dispatched_total == 7


@pytest.fixture
def segment() -> Iterator[PeerSegment]:
    seg = PeerSegment(PeerLayout(workers=2, slots=8))
    yield seg
    seg.close()


async def test_with_two_workers_discovery_in_one_reaches_both(
    core: ProxyCore, segment: PeerSegment, tmp_path: Path
) -> None:
    log = tmp_path / "changes.jsonl"
    s0 = PeerSync(core.fleet, PeerLoad.attach(segment.name, 0), ChangeLog(log), 0.02)
    other = FleetRegistry(stale_after=1.0)
    other.add(BackendSpec(id="127.0.0.1:9", url="http://127.0.0.1:9"))
    s1 = PeerSync(other, PeerLoad.attach(segment.name, 1), ChangeLog(log), 0.02)
    try:
        d = DiscoveryLoop(core, SharedChanges(s0), HandSource(), drain_timeout=30)
        d.publish(want(pod("p1"), pod("p2", "10.0.0.2")))
        await d.step()
        s1.step()
        assert sorted(b.id for b in other) == ["127.0.0.1:9", "p1", "p2"]
        assert s1.slots.items() == s0.slots.items()  # the same shared load slots
        d.publish(want(pod("p2", "10.0.0.2", unit="u")))
        await d.step()
        await eventually(lambda: core.fleet.get("p1") is None)
        s1.step()
        p2 = other.get("p2")
        assert p2 is not None and p2.spec.unit == "u" and p2.spec.source == KUBERNETES
        assert other.get("p1") is None and s1.slots.items() == s0.slots.items()
    finally:
        s0.close()
        s1.close()
