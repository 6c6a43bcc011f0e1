"""Reading a JSON request's body whole, within `max_body_bytes` and the process's body budget
(proxy/request/body_budget.py): one reader per serving process, shared by the completions and
chat path and the Responses API, so every body they hold counts against one
`max_body_bytes_in_flight`."""

from __future__ import annotations

from collections.abc import Callable

from proxy.asgi import Receive
from proxy.errors import ProxyError
from proxy.request.body_budget import BodyBudget, no_room


class BodyReader:
    __slots__ = ("_count_refusal", "budget", "limit")

    def __init__(self, budget: BodyBudget, limit: int, count_refusal: Callable[[], None]) -> None:
        self.budget = budget
        self.limit = limit  # max_body_bytes, for one body
        self._count_refusal = count_refusal

    def no_room(self, size: int) -> ProxyError:
        """The 503 for a body of `size` bytes the budget had no room for, counted."""
        self._count_refusal()
        return no_room(self.budget, size)

    async def read(self, receive: Receive, declared: str | None) -> bytes:
        """The body, as many bytes as it has taken from the budget (the caller gives them
        back when the request ends); on failure none stay taken. A declared length
        (`content-length`) is taken before the first byte is read, a chunked body's bytes as
        they come."""
        limit = self.limit
        bodies = self.budget
        taken = 0
        if declared is not None and declared.isdigit():
            taken = int(declared)
            if taken > limit:
                raise ProxyError(413, f"request body over the {limit}-byte limit", code=413)
            # The wait's coroutine only when there is no room at once.
            if not bodies.take_now(taken) and not await bodies.take(taken):
                raise self.no_room(taken)
        chunks: list[bytes] = []
        size = 0
        try:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ProxyError(499, "client disconnected while sending the body")
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise ProxyError(413, f"request body over the {limit}-byte limit", code=413)
                if size > taken:  # a chunked body: its bytes are taken as they come
                    more = size - taken
                    if not bodies.take_now(more) and not await bodies.take(more):
                        raise self.no_room(size)
                    taken = size
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        except BaseException:
            bodies.release(taken)
            raise
        if taken > size:
            bodies.release(taken - size)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
