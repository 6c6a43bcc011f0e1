"""Real ZMQ sockets on loopback for KV-event tests: a subscriber that waits, bounded, for the
batches some action makes an engine publish."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import zmq
import zmq.asyncio

from fleet.kv_events import BatchCodec, EventBatch, seq_of

# Publishing on every simulated engine: ephemeral ports, bound on the engines' host.
SIM_KV_EVENTS = (
    '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:0", '
    '"replay_endpoint": "tcp://*:0", "topic": "kv"}'
)


def fresh_prompts(word: str) -> Iterator[str]:
    """Prompts sharing no first block: each one caches blocks of its own, so each one makes
    an engine publish."""
    return (f"{i} {word} " * 40 for i in itertools.count())


class Subscription:
    def __init__(self, socket: zmq.asyncio.Socket) -> None:
        self.socket = socket
        self._codec = BatchCodec()

    async def next(self, within: float) -> tuple[bytes, int, EventBatch]:
        """The next message as (topic, sequence number, batch); TimeoutError past `within`."""
        async with asyncio.timeout(within):
            topic, seq, payload = await self.socket.recv_multipart()
        return topic, seq_of(seq), self._codec.decode(payload)

    async def after(
        self, action: Callable[[], Awaitable[object]], within: float = 10.0
    ) -> tuple[bytes, int, EventBatch]:
        """Repeat `action` until a batch arrives (a new SUB socket misses what is published
        before its subscription reaches the publisher), bounded by `within` seconds."""
        async with asyncio.timeout(within):
            while True:
                await action()
                with contextlib.suppress(TimeoutError):
                    return await self.next(0.2)


@contextlib.asynccontextmanager
async def subscribed(endpoint: str, topic: bytes = b"") -> AsyncIterator[Subscription]:
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.SUBSCRIBE, topic)
    socket.connect(endpoint)
    try:
        yield Subscription(socket)
    finally:
        context.destroy(linger=0)
