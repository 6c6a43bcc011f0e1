"""When a worker's peer sync steps: at a request's arrival or end once an interval has passed,
by its timer within two intervals while it holds requests, and only at the idle beat when it
holds none. An idle worker's timer wake-ups cost more CPU than its steps."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet.change_log import ChangeLog
from fleet.clock import IDLE_BEAT_S, FakeClock
from fleet.peer_load import PeerLayout, PeerLoad, PeerSegment
from fleet.registry import FleetRegistry
from fleet.types import Backend, BackendSpec
from policies.loads import in_flight
from proxy.asgi import Receive, Scope, Send
from proxy.control.peer_sync import PeerSync, timer_delay
from proxy.serving.peer_touch import PeerTouch


def registry(*ids: str) -> FleetRegistry:
    fleet = FleetRegistry(stale_after=1.0)
    for i in ids:
        fleet.add(BackendSpec(id=i, url=f"http://{i}"))
    return fleet


def backend(sync: PeerSync, bid: str = "a") -> Backend:
    b = sync.fleet.get(bid)
    assert b is not None
    return b


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[PeerSync, PeerSync, FakeClock]]:
    """Two workers on one segment and change log, on one fake clock, interval 20 ms."""
    segment = PeerSegment(PeerLayout(workers=2, slots=8))
    clock = FakeClock(50.0)
    syncs = [
        PeerSync(registry("a"), PeerLoad.attach(segment.name, w), ChangeLog(tmp_path / "log"),
                 0.02, clock)
        for w in (0, 1)
    ]  # fmt: skip
    yield syncs[0], syncs[1], clock
    for s in syncs:
        s.close()
    segment.close()


def test_the_timer_waits_two_intervals_while_busy_and_the_idle_beat_otherwise() -> None:
    assert timer_delay(0.02, busy=True) == pytest.approx(0.04)
    assert timer_delay(0.02, busy=False) == IDLE_BEAT_S == 0.2
    # A long interval is never shortened by the beat.
    assert timer_delay(1.0, busy=False) == 1.0


def test_a_touch_steps_only_once_an_interval_has_passed(
    pair: tuple[PeerSync, PeerSync, FakeClock],
) -> None:
    s0, _, clock = pair
    s0.step()
    steps = s0.ticks
    clock.advance(0.015)
    assert s0.touch() is False and s0.ticks == steps
    clock.advance(0.006)
    assert s0.touch() is True and s0.ticks == steps + 1
    assert s0.touch() is False  # the step just now starts the next interval


def test_the_last_request_out_publishes_at_once(
    pair: tuple[PeerSync, PeerSync, FakeClock],
) -> None:
    """Within one interval: a request leaving while another is inside waits for the next
    step; the last one out steps, so the peers read this worker's final count at once."""
    s0, s1, clock = pair
    s0.step()
    a = backend(s0)
    s0.arrive()
    s0.arrive()
    a.load.dispatched_total = 2
    clock.advance(0.005)
    s0.leave()
    assert [r.dispatched for r in s1.rows()] == [0, 0]
    s0.leave()
    assert [r.dispatched for r in s1.rows()] == [2, 0]
    assert s0.inside == 0


async def test_a_request_after_a_quiet_spell_is_routed_on_its_peers_load_as_of_now(
    pair: tuple[PeerSync, PeerSync, FakeClock],
) -> None:
    """Worker 1 last stepped long ago; worker 0 has since taken 5 requests on "a". A request
    reaching worker 1 sees them before it is routed, and is counted inside while it runs."""
    s0, s1, clock = pair
    s1.step()
    backend(s0).load.in_flight = 5
    s0.step()
    clock.advance(0.1)  # a quiet spell, shorter than the idle beat: no timer step came
    assert in_flight(backend(s1)) == 0  # worker 1's view is as of its last step

    seen: list[tuple[int, int]] = []

    async def route(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append((in_flight(backend(s1)), s1.inside))

    touch = PeerTouch(route, s1)
    await touch({"type": "http"}, _no_receive, _no_send)
    assert seen == [(5, 1)]
    assert s1.inside == 0

    # The server's lifespan passes through without counting as a request.
    await touch({"type": "lifespan"}, _no_receive, _no_send)
    assert seen[-1] == (5, 0)


async def _no_receive() -> dict[str, object]:
    raise AssertionError("not read")


async def _no_send(message: dict[str, object]) -> None:
    raise AssertionError("not sent")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[PeerSync, PeerSync]]:
    """Two workers on the real clock, interval 20 ms."""
    segment = PeerSegment(PeerLayout(workers=2, slots=8))
    syncs = [
        PeerSync(registry("a"), PeerLoad.attach(segment.name, w), ChangeLog(tmp_path / "log"),
                 0.02)
        for w in (0, 1)
    ]  # fmt: skip
    yield syncs[0], syncs[1]
    for s in syncs:
        s.close()
    segment.close()


async def test_an_idle_worker_keeps_its_timer_quiet_and_a_busy_one_shares_its_load(
    live: tuple[PeerSync, PeerSync],
) -> None:
    s0, s1 = live
    s0.step()
    task = asyncio.create_task(s0.run())
    try:
        # Idle: a step per idle beat (0.2 s), where a 20 ms timer would have stepped ~30
        # times. A loaded machine only delays timers, so this bound holds there too.
        start = s0.ticks
        await asyncio.sleep(0.6)
        assert s0.ticks - start <= 4

        # Load arrives with no request through this worker's app (a stream's pending
        # prefill, say): the next beat finds it, then the timer steps every two intervals.
        backend(s0).load.in_flight = 3

        async def peer_sees(n: int) -> bool:
            while True:
                s1.step()
                if in_flight(backend(s1)) == n:
                    return True
                await asyncio.sleep(0.01)

        await asyncio.wait_for(peer_sees(3), timeout=10)
        busy_from = s0.ticks

        async def steps_on() -> None:
            while s0.ticks < busy_from + 5:
                await asyncio.sleep(0.01)

        await asyncio.wait_for(steps_on(), timeout=10)
        # And once the load is gone, the timer publishes the zeroes.
        backend(s0).load.in_flight = 0
        await asyncio.wait_for(peer_sees(0), timeout=10)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
