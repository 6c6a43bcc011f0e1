"""The fleet operations the admin API, the colocated planner and the discovery loop share, on a
real ProxyCore with live requests that move as told."""

from __future__ import annotations

import pytest

from fleet.changes import LocalChanges
from fleet.discovery import ADMIN
from fleet.types import BackendSpec
from proxy.control import operations
from proxy.control.operations import NoBackend
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings
from tests.unit.rescheduler.fakes import FakeEntry


@pytest.fixture
def core() -> ProxyCore:
    urls = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    return ProxyCore(load_settings({"backends": urls, "move_timeout": 5.0}))


def ids(core: ProxyCore) -> tuple[str, str]:
    a, b = (backend.id for backend in core.fleet)
    return a, b


async def test_a_backend_added_by_hand_is_tagged_so_discovery_leaves_it(core: ProxyCore) -> None:
    changes = LocalChanges(core.fleet)
    added = await operations.add_backend(changes, BackendSpec("w1", "http://127.0.0.1:9/w"))
    assert added.spec.source == ADMIN and core.fleet.get("w1") is added


async def test_draining_a_missing_backend_is_a_key_error_naming_it(core: ProxyCore) -> None:
    changes = LocalChanges(core.fleet)
    with pytest.raises(KeyError) as raised:
        await operations.set_draining(changes, "nope", True)
    assert isinstance(raised.value, NoBackend) and raised.value.message == "no backend 'nope'"
    a, _ = ids(core)
    drained = await operations.set_draining(changes, a, True)
    assert drained.draining and not (await operations.set_draining(changes, a, False)).draining


async def test_a_request_found_by_its_request_id_or_its_upstream_id(core: ProxyCore) -> None:
    a, _ = ids(core)
    entry = FakeEntry("client-id", a, "upstream-id")
    core.live.add(entry)
    assert operations.find_live_request(core.live, "client-id") is entry
    assert operations.find_live_request(core.live, "upstream-id") is entry
    assert operations.find_live_request(core.live, "other") is None


async def test_a_request_no_longer_on_the_source_is_not_moved(core: ProxyCore) -> None:
    a, b = ids(core)
    entry = FakeEntry("r1", a)
    result = await operations.move_one(core, entry, core.fleet.get(b), "p", source=b)
    assert result == {"request_id": "r1", "outcome": "not_movable", "detail": f"no longer on {b}"}
    assert entry.moves == []


async def test_move_outcomes(core: ProxyCore) -> None:
    a, b = ids(core)
    target = core.fleet.get(b)
    moved = await operations.move_one(core, FakeEntry("r1", a), target, "p", source=a)
    assert moved["outcome"] == "ok" and moved["target"] == b
    stuck = await operations.move_one(core, FakeEntry("r2", a, not_movable="move_limit"), None, "p")
    assert stuck == {"request_id": "r2", "outcome": "not_movable", "detail": "move_limit"}
    slow = FakeEntry("r3", a, move_delay=5.0)
    pending = await operations.move_one(core, slow, target, "p", wait_s=0.01)
    assert pending == {"request_id": "r3", "outcome": "pending", "detail": "still moving"}


async def test_evacuating_drains_and_moves_every_request_on_the_backend(core: ProxyCore) -> None:
    a, b = ids(core)
    on_a = [FakeEntry("r1", a), FakeEntry("r2", a, not_movable="move_limit")]
    on_b = FakeEntry("r3", b)
    for e in (*on_a, on_b):
        core.live.add(e)
    backend = core.fleet.get(a)
    assert backend is not None
    result = await operations.evacuate_backend(
        core, LocalChanges(core.fleet), backend, reason="gone"
    )
    assert backend.draining and result["requests"] == 2
    assert result["outcomes"] == {"ok": 1, "not_movable": 1}
    assert on_a[0].moves == [(None, "gone")] and on_b.moves == []
