"""The live-request table: every client request in flight, as the admin API and the movers
(migrate, evacuate, and the background tasks built on them) see it. Routing never reads it:
it routes on each backend's `Load` and scrape.

An entry is the request's session itself (proxy/request/session.py); the table keeps no stream
bytes, so its memory does not grow with the tokens relayed. It lives in fleet/, which imports none
of the other packages, so that the proxy, which fills it, and the rescheduler, which reads it, both
import it without importing each other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from fleet.types import Backend


class NotMovable(Exception):
    """A move was asked of a request that cannot move now; `reason` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class MoveResult:
    """How a move ended. `outcome`: ok | failed | finished (the request ended first) |
    returned (its target failed to continue it, so it continued on its source)."""

    outcome: str
    source: str
    target: str | None = None
    tokens: int = 0  # generated tokens the client had when the stream was cut
    downtime_s: float | None = None  # last token from the source to first from the target
    detail: str = ""
    kind: str = "recompute"  # how the KV reached the target (proxy/stream/move_kinds.py)

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"


class LiveEntry(Protocol):
    """What the table, the admin API and the movers need of a request in flight."""

    @property
    def request_id(self) -> str: ...

    @property
    def backend_id(self) -> str: ...

    @property
    def upstream_request_id(self) -> str:
        """The x-request-id its first leg was sent with: unique among live requests (the proxy
        makes one per request), so the rescheduler names requests by it."""
        ...

    @property
    def arrived_at(self) -> float:
        """When (clock seconds) the proxy received it."""
        ...

    @property
    def running(self) -> bool:
        """Its current backend has started answering (else it waits: queued or prefilling)."""
        ...

    @property
    def charged_prompt_tokens(self) -> int:
        """The prompt tokens its current backend was charged: the uncached part the policy
        expected it to compute (all of the prompt when the policy did not say)."""
        ...

    @property
    def tokens_generated(self) -> int:
        """Tokens its client has received (0 when they are not counted)."""
        ...

    def movable_reason(self, planned: bool) -> str:
        """Empty when the request can move now; else why not."""
        ...

    def view(self) -> dict[str, Any]: ...

    def backend_down(self, why: str) -> None:
        """The backend serving the request was found down or stalled: leave it now."""
        ...

    def waiting_since(self) -> float | None:
        """Since when (clock seconds) the request has waited for its current backend's first
        output; None once output flows."""
        ...

    def last_read(self) -> float:
        """When (clock seconds) a byte last came from its current backend; 0 if none."""
        ...

    async def move(
        self,
        to: Backend | None = None,
        reason: str = "admin",
        *,
        kind: str | None = None,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> MoveResult:
        """Cut the stream after the last token its client received and continue it on `to`
        (None: where the policy chooses); `kind`: auto, recompute, handover or precopy (None:
        the `move_kind` setting). `hold`: awaited between the cut and the continuation (a
        suspension: the request holds no backend meanwhile, and may continue on any one,
        its own included); it raises ProxyError to end the request instead. Raises
        NotMovable."""
        ...


class LiveTable:
    """Keyed by the entry itself: clients may reuse an x-request-id, entries must not collide."""

    def __init__(self) -> None:
        self._requests: dict[LiveEntry, None] = {}

    def add(self, req: LiveEntry) -> None:
        self._requests[req] = None

    def remove(self, req: LiveEntry) -> None:
        self._requests.pop(req, None)

    def find(self, request_id: str) -> list[LiveEntry]:
        return [r for r in self._requests if r.request_id == request_id]

    def by_upstream_id(self, upstream_request_id: str) -> LiveEntry | None:
        for r in self._requests:
            if r.upstream_request_id == upstream_request_id:
                return r
        return None

    def on_backend(self, backend_id: str) -> list[LiveEntry]:
        return [r for r in self._requests if r.backend_id == backend_id]

    def __iter__(self) -> Iterator[LiveEntry]:
        return iter(list(self._requests))

    def __len__(self) -> int:
        return len(self._requests)
