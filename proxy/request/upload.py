"""Reading a large request body from the client in bounded memory: the audio routes' uploads.

The bytes held at once (the part read before the body can be routed, or the whole of a body
small enough to be sent again) are taken from the process's body budget as they are read and
given back by the caller; the rest passes through, one chunk at a time. `max_body_bytes`
holds for every body, declared or chunked: past it, 413.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from proxy.asgi import Receive
from proxy.errors import ProxyError
from proxy.request.body_budget import BodyBudget


def too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"request body over the {limit}-byte limit", code=413)


class BodyCut(Exception):
    """The body stopped passing through: over the limit, or its client left. `error` is what
    the client is answered."""

    def __init__(self, error: ProxyError) -> None:
        super().__init__(error.message)
        self.error = error


class Upload:
    """One client's body, read as the caller asks. `held` bytes are taken from `bodies`."""

    __slots__ = ("_bodies", "_limit", "_no_room", "_receive", "ended", "held", "kept", "size")

    def __init__(
        self,
        receive: Receive,
        limit: int,
        bodies: BodyBudget,
        no_room: Callable[[int], ProxyError],
    ) -> None:
        self._receive = receive
        self._limit = limit
        self._bodies = bodies
        # The answer when the budget has no room for the bytes to hold (their total then).
        self._no_room = no_room
        self.kept: list[bytes] = []  # the bytes read and held, in order
        self.held = 0
        self.size = 0  # bytes read so far
        self.ended = False

    async def _next(self) -> bytes:
        message = await self._receive()
        if message["type"] == "http.disconnect":
            raise ProxyError(499, "client disconnected while sending the body")
        chunk: bytes = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self._limit:
            raise too_large(self._limit)
        if not message.get("more_body", False):
            self.ended = True
        return chunk

    async def keep_next(self) -> bytes:
        """Read the next chunk and hold it (taken from the budget); b"" at the end."""
        if self.ended:
            return b""
        chunk = await self._next()
        n = len(chunk)
        bodies = self._bodies
        if not bodies.take_now(n) and not await bodies.take(n):
            raise self._no_room(self.held + n)
        self.held += n
        self.kept.append(chunk)
        return chunk

    def whole(self) -> bytes:
        """Every byte, once `ended`: the body kept whole."""
        return b"".join(self.kept)

    async def rest(self) -> AsyncIterator[bytes]:
        """What was kept, then the chunks still to come as they arrive; each kept chunk's
        bytes go back to the budget once handed on. Raises BodyCut."""
        bodies = self._bodies
        while self.kept:
            chunk = self.kept.pop(0)
            yield chunk
            self.held -= len(chunk)
            bodies.release(len(chunk))
        try:
            while not self.ended:
                yield await self._next()
        except ProxyError as e:
            raise BodyCut(e) from None

    def release(self) -> None:
        """Give the held bytes back (the request is over)."""
        self._bodies.release(self.held)
        self.held = 0
        self.kept.clear()
