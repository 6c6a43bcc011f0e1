"""The backend's answer to a Responses request made the proxy's: its response object carries
the proxy's id (the one a follow-up names), and the thread fields the backend never saw.

`HeldAnswer` takes a whole answer from a request session in place of the client; a streamed
one goes through `StreamStamper`, event by event, to the client.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.asgi import Message, Send
from proxy.errors import ProxyError

# The events whose data holds the whole response object (vLLM 0.32, OpenAI).
_RESPONSE_EVENTS = frozenset(
    {
        b"response.created",
        b"response.queued",
        b"response.in_progress",
        b"response.completed",
        b"response.incomplete",
        b"response.failed",
    }
)
# Those that end a stream: their response is the one kept.
FINAL_EVENTS = frozenset({b"response.completed", b"response.incomplete", b"response.failed"})


Keep = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Identity:
    """What the proxy says of a response whatever the backend said."""

    id: str
    previous_id: str | None
    store: bool
    background: bool

    def stamp(self, response: dict[str, Any]) -> dict[str, Any]:
        return {
            **response,
            "id": self.id,
            "previous_response_id": self.previous_id,
            "store": self.store,
            "background": self.background,
        }


class HeldAnswer:
    """An ASGI `send` that keeps the answer instead of sending it, up to `limit` bytes (the
    proxy stamps its id on the whole response object before the client gets it)."""

    __slots__ = ("chunks", "headers", "limit", "size", "status")

    def __init__(self, limit: int) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.limit = limit
        self.size = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = list(message.get("headers", []))
            return
        chunk = message.get("body", b"")
        self.size += len(chunk)
        if self.size > self.limit:
            raise ProxyError(
                502,
                f"the backend's answer is over the {self.limit}-byte cap (max_held_answer_bytes)",
                type="upstream_error",
                code=502,
            )
        self.chunks.append(chunk)

    @property
    def body(self) -> bytes:
        return b"".join(self.chunks)


class StreamStamper:
    """An ASGI `send` relaying a Responses event stream with the proxy's identity stamped
    on every response object, keeping the final one (`final`). Events reach the client as
    they come, whole: only what follows the last complete event waits for the next chunk."""

    __slots__ = ("_identity", "_keep", "_pending", "_send", "final")

    def __init__(self, send: Send, identity: Identity, keep: Keep | None) -> None:
        """`keep`: stores the final response before its event reaches the client, so that a
        follow-up sent at once finds it."""
        self._send = send
        self._identity = identity
        self._keep = keep
        self._pending = b""
        self.final: dict[str, Any] | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        more = message.get("more_body", False)
        data = self._pending + message.get("body", b"")
        cut = data.rfind(b"\n\n") + 2 if more else len(data)
        if cut < 2 and more:
            self._pending = data
            return
        self._pending = data[cut:]
        final = self.final
        out = self._stamped(data[:cut])
        if self.final is not final and self.final is not None and self._keep is not None:
            await self._keep(self.final)
        await self._send({"type": "http.response.body", "body": out, "more_body": more})

    def _stamped(self, events: bytes) -> bytes:
        parts = events.split(b"\n\n")
        for i, event in enumerate(parts):
            if not event.startswith(b"event: response."):
                continue
            name, _, data = event.partition(b"\n")
            kind = name[len(b"event: ") :].strip()
            if kind not in _RESPONSE_EVENTS or not data.startswith(b"data: "):
                continue
            try:
                payload = orjson.loads(data[len(b"data: ") :])
            except orjson.JSONDecodeError:
                continue
            response = payload.get("response") if isinstance(payload, dict) else None
            if not isinstance(response, dict):
                continue
            payload["response"] = stamped = self._identity.stamp(response)
            if kind in FINAL_EVENTS:
                self.final = stamped
            parts[i] = name + b"\ndata: " + orjson.dumps(payload)
        return b"\n\n".join(parts)
