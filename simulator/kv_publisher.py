"""One engine's KV-cache event publisher: the PUB socket, the replay ROUTER socket and the
numbering, in vLLM's wire format (fleet/kv_events.py).

The engine's core only records events (simulator/kv_cache.py); the engine's step loop hands
each step's events here as one batch. Batches are numbered from 0; a restarted engine starts
at 0 again, with an empty replay buffer, as a new vLLM process does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Sequence

import zmq
import zmq.asyncio

from fleet.kv_events import END_SEQ, BatchCodec, EventBatch, KvEvent, seq_bytes
from simulator.kv_events_config import EngineEndpoints, KvEventsConfig

log = logging.getLogger("simulator.kv_events")


class ReplayBuffer:
    """Sequence numbers and the last `capacity` payloads sent. No I/O."""

    def __init__(self, capacity: int) -> None:
        self._next = 0
        self._kept: deque[tuple[int, bytes]] = deque(maxlen=capacity)

    def record(self, payload: bytes) -> int:
        seq = self._next
        self._next += 1
        self._kept.append((seq, payload))
        return seq

    def since(self, start: int) -> list[tuple[int, bytes]]:
        return [(seq, payload) for seq, payload in self._kept if seq >= start]

    def restart(self) -> None:
        self._next = 0
        self._kept.clear()


class KvEventPublisher:
    def __init__(self, endpoints: EngineEndpoints, config: KvEventsConfig) -> None:
        self._context = zmq.asyncio.Context()
        self._sockets: list[zmq.Socket[bytes] | zmq.asyncio.Socket] = []  # term() waits for each
        try:
            self._open(endpoints, config)
        except zmq.ZMQError:
            self._close_sockets()  # an address in use: nothing left open
            raise
        self._topic = config.topic.encode()
        self._buffer = ReplayBuffer(config.buffer_steps)
        self._codec = BatchCodec()
        self._task: asyncio.Task[None] | None = None

    def _open(self, endpoints: EngineEndpoints, config: KvEventsConfig) -> None:
        # A plain socket: a PUB send never blocks (past the high-water mark ZMQ drops).
        self._pub = zmq.Socket(self._context, zmq.PUB)
        self._sockets.append(self._pub)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.setsockopt(zmq.SNDHWM, config.hwm)
        if endpoints.publish_binds:
            self._pub.bind(endpoints.publish)
            self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            self._pub.connect(endpoints.publish)
            self.endpoint = endpoints.publish
        self._router: zmq.asyncio.Socket | None = None
        self.replay_endpoint: str | None = None
        if endpoints.replay is not None:
            self._router = self._context.socket(zmq.ROUTER)
            self._sockets.append(self._router)
            self._router.setsockopt(zmq.LINGER, 0)
            self._router.bind(endpoints.replay)
            self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)

    def start(self) -> None:
        if self._router is not None and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._serve_replays())

    def publish(self, events: Sequence[KvEvent], ts: float) -> int:
        """Send one step's events as the next batch; returns its number."""
        seq, payload = self.record(events, ts)
        self.send(seq, payload)
        return seq

    def record(self, events: Sequence[KvEvent], ts: float) -> tuple[int, bytes]:
        """Number and keep a batch for replay without sending it: on its own, a batch lost on
        the way (what a subscriber's gap handling is for)."""
        payload = self._codec.encode(EventBatch(ts, list(events), 0))
        return self._buffer.record(payload), payload

    def send(self, seq: int, payload: bytes) -> None:
        with contextlib.suppress(zmq.Again):
            self._pub.send_multipart([self._topic, seq_bytes(seq), payload], flags=zmq.NOBLOCK)

    def restart(self) -> None:
        """The engine restarted: numbering from 0 again, nothing to replay."""
        self._buffer.restart()

    async def _serve_replays(self) -> None:
        router = self._router
        assert router is not None
        while True:
            frames = await router.recv_multipart()
            if len(frames) != 3 or len(frames[2]) != 8:
                log.warning("malformed replay request: %d frames", len(frames))
                continue
            client, start = frames[0], int.from_bytes(frames[2], "big")
            for seq, payload in self._buffer.since(start):
                await router.send_multipart([client, b"", self._topic, seq_bytes(seq), payload])
            await router.send_multipart([client, b"", b"", END_SEQ, b""])

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._close_sockets()

    def _close_sockets(self) -> None:
        for socket in self._sockets:
            socket.close(linger=0)
        self._context.term()
