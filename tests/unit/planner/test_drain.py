"""choose_victim and the drain procedure against an in-memory proxy admin."""

from __future__ import annotations

import pytest

from fleet.clock import FakeClock
from fleet.types import Role
from planner.config import PlannerRole
from planner.connector import WorkerInfo
from planner.drain import DrainOutcome, Sleep, choose_victim, drain
from planner.proxy_admin import LiveRequest
from tests.unit.planner.fake_admin import FakeAdmin


def workers(*ids: str) -> list[WorkerInfo]:
    return [WorkerInfo(i, f"http://127.0.0.1/{i}", PlannerRole.DECODE) for i in ids]


def test_victim_holds_fewest_tokens() -> None:
    live = {"a": [100, 50], "b": [120], "c": [10, 10, 10, 200]}
    assert choose_victim(workers("a", "b", "c"), live).id == "b"


def test_victim_idle_worker_wins() -> None:
    assert choose_victim(workers("a", "b"), {"a": [1]}).id == "b"


def test_victim_ties_by_fewest_requests_then_id() -> None:
    assert choose_victim(workers("a", "b"), {"a": [50, 50], "b": [100]}).id == "b"
    assert choose_victim(workers("b", "a"), {"a": [10], "b": [10]}).id == "a"


def admin_with_requests() -> FakeAdmin:
    admin = FakeAdmin()
    admin.add("w1", Role.DECODE)
    admin.add("w2", Role.DECODE)
    admin.live = [LiveRequest("w1", 100, 5), LiveRequest("w1", 50, 1), LiveRequest("w2", 9, 9)]
    return admin


def sleeper(clock: FakeClock) -> tuple[list[float], Sleep]:
    slept: list[float] = []

    async def sleep(s: float) -> None:
        slept.append(s)
        clock.advance(s)

    return slept, sleep


async def test_drain_moves_waits_and_unregisters() -> None:
    admin = admin_with_requests()
    admin.stuck = {1}  # one request cannot move; it finishes after a while
    clock = FakeClock(0.0)
    slept, sleep = sleeper(clock)

    def finish(a: FakeAdmin) -> None:
        if clock.now() >= 1.0:
            a.live = [r for r in a.live if r.backend != "w1"]

    admin.on_poll = finish
    report = await drain(admin, "w1", 5.0, clock, poll_s=0.25, sleep=sleep)
    assert report.outcome is DrainOutcome.DRAINED
    assert report.remaining == 0
    assert report.evacuated == {"ok": 1}
    assert admin.calls == [("drain", "w1"), ("evacuate", "w1"), ("remove", "w1")]
    assert slept and all(s <= 0.25 for s in slept)
    assert 1.0 <= report.waited_s < 5.0
    assert "w1" not in admin.backends_by_id


async def test_drain_deadline_leaves_worker_up() -> None:
    admin = admin_with_requests()
    admin.stuck = {0}  # never finishes
    clock = FakeClock(0.0)
    _, sleep = sleeper(clock)
    report = await drain(admin, "w1", 2.0, clock, poll_s=0.5, sleep=sleep)
    assert report.outcome is DrainOutcome.DRAIN_TIMEOUT
    assert report.remaining == 1
    assert report.waited_s >= 2.0
    assert ("remove", "w1") not in admin.calls
    assert admin.calls[-1] == ("undrain", "w1")
    assert "w1" in admin.backends_by_id and not admin.backends_by_id["w1"].draining
    assert len(admin.live) == 3  # nothing aborted


async def test_drain_idle_worker_removed_at_once() -> None:
    admin = FakeAdmin()
    admin.add("w1", Role.DECODE)
    clock = FakeClock(0.0)
    slept, sleep = sleeper(clock)
    report = await drain(admin, "w1", 2.0, clock, sleep=sleep)
    assert report.outcome is DrainOutcome.DRAINED
    assert slept == []


async def test_failed_evacuate_still_waits_for_the_requests() -> None:
    class NoMoves(FakeAdmin):
        async def evacuate(self, backend_id: str) -> dict[str, int]:
            self.calls.append(("evacuate", backend_id))
            raise TimeoutError("moves took too long")

    admin = NoMoves()
    admin.add("w1", Role.DECODE)
    admin.live = [LiveRequest("w1", 10, 10)]
    clock = FakeClock(0.0)
    _, sleep = sleeper(clock)

    def finish(a: FakeAdmin) -> None:
        if clock.now() >= 0.5:
            a.live = []

    admin.on_poll = finish
    report = await drain(admin, "w1", 5.0, clock, poll_s=0.25, sleep=sleep)
    assert report.outcome is DrainOutcome.DRAINED
    assert "moves took too long" in report.evacuate_error
    assert admin.calls[-1] == ("remove", "w1")


async def test_proxy_failing_mid_drain_undrains_and_raises() -> None:
    class Flaky(FakeAdmin):
        async def live_requests(self) -> list[LiveRequest]:
            raise OSError("connection refused")

    admin = Flaky()
    admin.add("w1", Role.DECODE)
    clock = FakeClock(0.0)
    _, sleep = sleeper(clock)
    with pytest.raises(OSError):
        await drain(admin, "w1", 5.0, clock, sleep=sleep)
    assert admin.calls[-1] == ("undrain", "w1")
    assert not admin.backends_by_id["w1"].draining
