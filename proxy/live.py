"""The live-request table: what the proxy knows about every request in flight.

It keeps what the admin API shows and what routing needs about each request (the parsed body
with the prompt and sampling parameters, where it runs, its progress in SSE events), never
the stream's bytes: a table of long streams would otherwise grow with every token relayed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True, eq=False)
class LiveRequest:
    request_id: str
    endpoint: str
    model: str
    body: dict[str, Any]
    stream: bool
    prompt_tokens: int  # estimate charged to pending prefill
    backend_id: str = ""
    started_at: float = 0.0
    dispatched_at: float = 0.0
    first_token_at: float | None = None
    events: int = 0  # SSE data events relayed; about one token each on vLLM
    attempts: int = 0


class LiveTable:
    """Keyed by the entry itself: clients may reuse an x-request-id, entries must not collide."""

    def __init__(self) -> None:
        self._requests: dict[LiveRequest, None] = {}

    def add(self, req: LiveRequest) -> None:
        self._requests[req] = None

    def remove(self, req: LiveRequest) -> None:
        self._requests.pop(req, None)

    def find(self, request_id: str) -> list[LiveRequest]:
        return [r for r in self._requests if r.request_id == request_id]

    def __iter__(self) -> Iterator[LiveRequest]:
        return iter(list(self._requests))

    def __len__(self) -> int:
        return len(self._requests)

    def on_backend(self, backend_id: str) -> list[LiveRequest]:
        return [r for r in self._requests if r.backend_id == backend_id]
