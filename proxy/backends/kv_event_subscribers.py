"""The sockets around `KvEventStream`: one SUB socket per backend that publishes KV-cache
events, a DEALER for replays, and a reconcile loop that follows the fleet.

Every serving process (`--workers N`) and every proxy replica runs its own subscribers on the
same events, so each builds the same index with no shared memory. ZMQ reconnects a SUB socket
by itself; a publisher that restarted is recognised by its sequence numbers
(fleet/kv_event_stream.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

import zmq
import zmq.asyncio

from fleet.clock import Clock
from fleet.kv_event_stream import KvEventStream
from fleet.kv_events import BatchCodec, DecodeError, EventBatch, seq_bytes, seq_of
from fleet.precise_prefix import PrecisePrefixIndex
from fleet.registry import FleetRegistry

log = logging.getLogger("fleet_proxy.kv_events")

# Batches a SUB socket queues while the loop is busy (a replay); past that ZMQ drops, which
# shows as a gap.
RECEIVE_HWM = 100_000
RECONNECT_MAX_MS = 5_000


@dataclass(frozen=True, slots=True)
class Feed:
    """Where one backend's events come from."""

    endpoint: str
    replay_endpoint: str  # "" when none
    instance: str


class KvEventSubscriber:
    def __init__(
        self,
        context: zmq.asyncio.Context,
        feed: Feed,
        topic: str,
        stream: KvEventStream,
        clock: Clock,
        replay_timeout_s: float,
    ) -> None:
        self._context = context
        self.feed = feed
        self._topic = topic.encode()
        self.stream = stream
        self._clock = clock
        self._replay_timeout = replay_timeout_s
        self._codec = BatchCodec()

    async def run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, RECEIVE_HWM)
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_MAX_MS)  # back off from a gone engine
        sub.setsockopt(zmq.SUBSCRIBE, self._topic)
        sub.connect(self.feed.endpoint)
        try:
            if self.feed.replay_endpoint:
                # Subscribed first, so what is published after the replay's answer comes live.
                batches, reached_end = await self._fetch(0)
                self.stream.joined(batches, reached_end, self._clock.now())
            while True:
                frames = await sub.recv_multipart()
                message = self._message(frames)
                if message is None:
                    continue
                since = self.stream.live(*message, self._clock.now())
                if since is not None:
                    batches = await self.replay(since)
                    self.stream.replayed(batches, self._clock.now())
        finally:
            sub.close(linger=0)

    def _message(self, frames: list[bytes]) -> tuple[int, EventBatch] | None:
        # (topic, sequence, payload); a topic is a prefix filter, so it is not checked again.
        if len(frames) != 3:
            self.stream.counters.undecodable += 1
            return None
        try:
            return seq_of(frames[1]), self._codec.decode(frames[2])
        except DecodeError as e:
            self.stream.counters.undecodable += 1
            log.debug("backend %s: %s", self.stream.backend_id, e)
            return None

    async def replay(self, since: int) -> list[tuple[int, EventBatch]]:
        batches, _ = await self._fetch(since)
        return batches

    async def _fetch(self, since: int) -> tuple[list[tuple[int, EventBatch]], bool]:
        batches, undecodable, reached_end = await fetch_replay(
            self._context, self.feed.replay_endpoint, since, self._replay_timeout, self._codec
        )
        self.stream.counters.undecodable += undecodable
        return batches, reached_end


async def fetch_replay(
    context: zmq.asyncio.Context,
    endpoint: str,
    since: int,
    timeout_s: float,
    codec: BatchCodec,
) -> tuple[list[tuple[int, EventBatch]], int, bool]:
    """The batches from `since` on that an engine's replay socket still has, in order, how
    many did not decode, and whether the answer reached the end marker. Stops early when the
    first one is not `since` (the hole cannot be filled), at a batch that does not decode, at
    the end marker or at the timeout; never raises for the engine's faults: a short answer
    tells the caller to start over."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    got: list[tuple[int, EventBatch]] = []
    undecodable = 0
    reached_end = False
    try:
        async with asyncio.timeout(timeout_s):
            await dealer.send_multipart([b"", seq_bytes(since)])
            while True:
                frames = await dealer.recv_multipart()
                # (empty, topic, sequence, payload); the end is (empty, empty, END_SEQ, empty)
                if len(frames) != 4:
                    break
                seq = seq_of(frames[2])
                if seq < 0:
                    reached_end = True
                    break
                if not got and seq != since:
                    break
                try:
                    got.append((seq, codec.decode(frames[3])))
                except DecodeError:
                    undecodable += 1
                    break  # a hole: what follows cannot be applied in order
    except (TimeoutError, DecodeError, zmq.ZMQError) as e:
        log.info("replay from %d at %s ended early: %r", since, endpoint, e)
    finally:
        dealer.close(linger=0)
    return got, undecodable, reached_end


class KvEventSubscribers:
    """A subscriber for every backend in the fleet that names an events endpoint: started as
    backends come (settings, admin API, Kubernetes discovery), stopped and their index
    dropped as they go or change address."""

    def __init__(
        self,
        fleet: FleetRegistry,
        index: PrecisePrefixIndex,
        clock: Clock,
        *,
        topic: str = "",
        replay_timeout_s: float = 2.0,
        reconcile_s: float = 1.0,
    ) -> None:
        self.fleet = fleet
        self.index = index
        self._clock = clock
        self._topic = topic
        self._replay_timeout = replay_timeout_s
        self._reconcile_s = reconcile_s
        self._context: zmq.asyncio.Context | None = None
        self._running: dict[str, tuple[KvEventSubscriber, asyncio.Task[None]]] = {}

    def streams(self) -> list[KvEventStream]:
        # Copied in one step first: the /metrics collector reads this from a scrape thread.
        return [sub.stream for sub, _ in tuple(self._running.values())]

    def wanted(self) -> dict[str, Feed]:
        return {
            b.id: Feed(b.spec.kv_events_endpoint, b.spec.kv_events_replay_endpoint, b.spec.instance)
            for b in self.fleet
            if b.spec.kv_events_endpoint
        }

    def reconcile(self) -> None:
        """Start and stop subscribers to match the fleet now."""
        if self._context is None:
            self._context = zmq.asyncio.Context()
        wanted = self.wanted()
        for backend_id, (sub, task) in list(self._running.items()):
            # A subscriber that ended on an error starts again, with its index.
            if wanted.get(backend_id) != sub.feed or task.done():
                self._stop(backend_id)
        for backend_id, feed in wanted.items():
            if backend_id not in self._running:
                self._start(backend_id, feed)

    def _start(self, backend_id: str, feed: Feed) -> None:
        assert self._context is not None
        stream = KvEventStream(backend_id, self.index, can_replay=bool(feed.replay_endpoint))
        sub = KvEventSubscriber(
            self._context, feed, self._topic, stream, self._clock, self._replay_timeout
        )
        task = asyncio.create_task(sub.run(), name=f"kv-events-{backend_id}")
        task.add_done_callback(lambda t: _log_end(backend_id, t))
        self._running[backend_id] = (sub, task)

    def _stop(self, backend_id: str) -> None:
        entry = self._running.pop(backend_id, None)
        if entry is not None:
            entry[1].cancel()
        self.index.forget(backend_id)

    async def run(self) -> None:
        try:
            while True:
                self.reconcile()
                await asyncio.sleep(self._reconcile_s)
        finally:
            await self.close()

    async def close(self) -> None:
        tasks = [task for _, task in self._running.values()]
        for backend_id in list(self._running):
            self._stop(backend_id)
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None


def _log_end(backend_id: str, task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("KV-event subscriber of %s stopped", backend_id, exc_info=task.exception())
