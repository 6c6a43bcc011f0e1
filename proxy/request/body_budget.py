"""The request-body bytes a serving process holds at once, bounded.

Each request may send up to `max_body_bytes`; without a total, a few hundred concurrent large
bodies exhaust the machine. A request takes its body's bytes from this budget before it reads
them (uvicorn stops reading a socket whose body nobody receives, so a waiting request holds
next to nothing) and gives them back when it ends: retries and continuations re-send the body,
so it is held until then. A request that finds no room waits up to `wait_s`, first come first
served, then is refused.

One event loop per process: plain integer arithmetic, no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque

from proxy.errors import ProxyError


class BodyBudget:
    __slots__ = ("_waiters", "held", "limit", "wait_s")

    def __init__(self, limit: int, wait_s: float) -> None:
        self.limit = limit
        self.wait_s = wait_s
        self.held = 0
        # Requests waiting for room, in arrival order: (bytes wanted, resolved once taken).
        self._waiters: deque[tuple[int, asyncio.Future[bool]]] = deque()

    def take_now(self, n: int) -> bool:
        """Take `n` bytes if they fit and nobody waits before us."""
        if self._waiters or self.held + n > self.limit:
            return False
        self.held += n
        return True

    async def take(self, n: int) -> bool:
        """Take `n` bytes, waiting up to `wait_s` for room; False when none came in time."""
        if self.take_now(n):
            return True
        if n > self.limit or self.wait_s <= 0:
            return False
        loop = asyncio.get_running_loop()
        # Resolved True once the bytes are taken for us, False when the wait ran out.
        waiter: asyncio.Future[bool] = loop.create_future()
        entry = (n, waiter)
        self._waiters.append(entry)
        expiry = loop.call_later(self.wait_s, self._expire, entry)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.result():
                self.release(n)  # cancelled just as room came: it goes to the next in line
            else:
                self._leave(entry)
            raise
        finally:
            expiry.cancel()

    def release(self, n: int) -> None:
        self.held -= n
        if self._waiters:
            self._wake()

    def _expire(self, entry: tuple[int, asyncio.Future[bool]]) -> None:
        if not entry[1].done():
            self._leave(entry)
            entry[1].set_result(False)

    def _leave(self, entry: tuple[int, asyncio.Future[bool]]) -> None:
        try:
            self._waiters.remove(entry)
        except ValueError:
            return
        self._wake()  # a big request leaving the head of the line may let smaller ones in

    def _wake(self) -> None:
        """Give room to the waiters at the head of the line, in order, while they fit."""
        waiters = self._waiters
        while waiters:
            n, waiter = waiters[0]
            if waiter.done():  # cancelled, about to leave
                waiters.popleft()
                continue
            if self.held + n > self.limit:
                return
            waiters.popleft()
            self.held += n
            waiter.set_result(True)


def no_room(bodies: BodyBudget, size: int) -> ProxyError:
    """The 503 for a body whose `size` bytes found no room in `bodies` in time."""
    return ProxyError(
        503,
        f"the proxy holds {bodies.held} bytes of request bodies; this one's {size} would "
        f"pass its max_body_bytes_in_flight ({bodies.limit}); retry shortly",
        type="service_unavailable",
        code=503,
        headers=[(b"retry-after", b"1")],
    )
