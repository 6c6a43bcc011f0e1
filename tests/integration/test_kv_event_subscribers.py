"""The proxy's KV-event subscribers on real ZMQ sockets (127.0.0.1) against the simulator's
publisher: batches reach the index, a lost batch is replayed or, without a replay socket,
the backend starts over, a restarted publisher starts it over, and subscribers follow the
fleet as backends come, go and move."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import replace

import pytest

from fleet.clock import FakeClock
from fleet.kv_event_stream import StreamCounters
from fleet.kv_events import BlockStored
from fleet.precise_prefix import PrecisePrefixIndex
from fleet.registry import FleetRegistry
from fleet.types import BackendSpec
from proxy.backends.kv_event_subscribers import KvEventSubscribers
from simulator.kv_events_config import KvEventsConfig
from simulator.kv_publisher import KvEventPublisher
from tests.support.polling import eventually, holds_within

WARMUP_S = 30.0


def stored(n: int) -> list[BlockStored]:
    """Stores one root block of tokens [n] * 4 (engine hash n)."""
    return [BlockStored([n], None, [n] * 4, 4)]


class Rig:
    def __init__(self, replay: bool) -> None:
        config = KvEventsConfig(
            enable_kv_cache_events=True,
            endpoint="tcp://*:0",
            replay_endpoint="tcp://*:0" if replay else None,
            topic="kv",
        )
        self.publisher = KvEventPublisher(config.for_engine(0, "127.0.0.1"), config)
        self.publisher.start()
        self.fleet = FleetRegistry(stale_after=1.0)
        self.spec = BackendSpec(
            id="e",
            url="http://127.0.0.1:9",
            kv_events_endpoint=self.publisher.endpoint,
            kv_events_replay_endpoint=self.publisher.replay_endpoint or "",
        )
        self.fleet.add(self.spec)
        self.clock = FakeClock()
        self.index = PrecisePrefixIndex(warmup_s=WARMUP_S)
        self.subs = KvEventSubscribers(
            self.fleet, self.index, self.clock, topic="kv", replay_timeout_s=5.0
        )

    def held(self, *ns: int) -> list[int]:
        return [self.index.match([n] * 4).blocks("e") for n in ns]

    def holds(self, n: int) -> Callable[[], bool]:
        return lambda: self.held(n) == [1]

    async def joined(self, start: int = 100) -> int:
        """Publish until the subscriber holds what was just sent (a SUB socket misses what is
        sent before its subscription arrives); returns the last number sent."""
        for n in range(start, start + 50):
            self.publisher.publish(stored(n), 0.0)
            if await holds_within(self.holds(n), within=0.2):
                return n
        raise AssertionError("the subscriber never received a batch")

    def counters(self) -> StreamCounters:
        (stream,) = self.subs.streams()
        return stream.counters

    async def close(self) -> None:
        await self.subs.close()
        await self.publisher.close()


@pytest.fixture
async def rig(request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    r = Rig(replay=request.param)
    r.subs.reconcile()
    try:
        yield r
    finally:
        await r.close()


@pytest.mark.parametrize("rig", [True], indirect=True)
async def test_a_lost_batch_is_replayed(rig: Rig) -> None:
    last = await rig.joined()
    rig.publisher.record(stored(1), 0.0)  # numbered and kept, never sent: lost on the way
    rig.publisher.publish(stored(2), 0.0)
    await eventually(rig.holds(2))
    assert rig.held(1, 2, last) == [1, 1, 1]
    counters = rig.counters()
    assert counters.gaps == 1 and counters.replays >= 1 and counters.resyncs == {}
    assert rig.index.precise("e", rig.clock.now())


@pytest.mark.parametrize("rig", [False], indirect=True)
async def test_a_lost_batch_without_replay_starts_the_backend_over(rig: Rig) -> None:
    last = await rig.joined()
    rig.publisher.record(stored(1), 0.0)
    rig.publisher.publish(stored(2), 0.0)
    await eventually(rig.holds(2))
    assert rig.held(1, last) == [0, 0]  # dropped, with all before the hole
    assert rig.counters().resyncs == {"gap": 1}
    # Blocks cached before the hole are unknown: the approximate index stands in for a while.
    assert not rig.index.precise("e", rig.clock.now())
    rig.clock.advance(WARMUP_S)
    assert rig.index.precise("e", rig.clock.now())


@pytest.mark.parametrize("rig", [False, True], indirect=True)
async def test_a_restarted_publisher_starts_the_backend_over(rig: Rig) -> None:
    last = await rig.joined()
    rig.publisher.restart()  # a new engine process: batches from 0, an empty cache
    rig.publisher.publish(stored(3), 0.0)
    await eventually(rig.holds(3))
    assert rig.held(last) == [0]
    assert rig.counters().resyncs == {"restart": 1}
    assert rig.index.precise("e", rig.clock.now())


@pytest.mark.parametrize("rig", [True], indirect=True)
async def test_subscribers_follow_the_fleet(rig: Rig) -> None:
    first = await rig.joined()
    rig.fleet.remove("e")
    rig.subs.reconcile()
    assert rig.subs.streams() == [] and rig.index.tracked() == []
    rig.fleet.add(rig.spec)
    rig.subs.reconcile()
    # A new subscriber joins late and replays from 0: everything published is held again.
    last = await rig.joined(start=200)
    assert rig.held(first, last) == [1, 1]
    assert rig.index.precise("e", rig.clock.now())
    # A new address is a new subscriber, and the old address's state is dropped.
    rig.fleet.update(replace(rig.spec, kv_events_endpoint="tcp://127.0.0.1:9"))
    rig.subs.reconcile()
    (stream,) = rig.subs.streams()
    assert stream.last_seq is None and rig.index.tracked() == []
