"""Structured request logs: one JSON line per finished OpenAI request (`request_log: json`),
to stderr or `request_log_file`, for a sampled share of requests (`request_log_sample_rate`).

The request's own task only appends a tuple of plain values read from its session (and two
clock readings) to a bounded queue; a background task turns the queue into lines every
`FLUSH_EVERY_S` and hands each batch to a worker thread for the write. So no request waits
on formatting or on a write, however slow the disk or the reader of stderr. A full queue
drops entries, counted in `fleet_proxy_request_log_dropped_total`. Off (the default), nothing
is built and the hot path does one `is None` check per request.

A line's fields: `time` (arrival, UTC), `request_id`, `endpoint`, `model`, `stream`, `status`,
`backends` (the backend of each leg that answered, in order), `attempts` (backends tried
before the first byte), `retries`, `moves`, `ttft_ms` (first streamed byte relayed; null for an
answer relayed whole), `e2e_ms`, `prompt_tokens` and `completion_tokens` (from the answer's
`usage` when it was relayed whole, `input_tokens` and `output_tokens` where the API names them
so; the completion count from the token ids of a tracked stream; otherwise null),
`routed_prompt_tokens` (the count routing used), `client_disconnect`; with flow control on,
also `tenant`, `priority` and `queue_wait_ms` (time in its queue).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import random
import sys
import time
from pathlib import Path
from typing import IO, Any, NamedTuple

import orjson
from prometheus_client import CollectorRegistry, Counter

from proxy.ports import FinishedRequest, FlowTicket
from proxy.stream.answer_usage import usage_counts

# How often the queue is written out; a line appears at most this long after its request.
FLUSH_EVERY_S = 0.1
# Entries waiting to be written; more are dropped (and counted).
CAPACITY = 10_000


class _Entry(NamedTuple):
    """One line to write: when the request ended, how long it took, and what it was."""

    wall_end: float
    e2e: float
    endpoint: str
    request_id: str
    status: int
    finished: FinishedRequest | None  # None: refused before a session served it
    flow: FlowTicket | None = None


class JsonRequestLog:
    def __init__(
        self,
        path: Path | None,
        sample_rate: float,
        registry: CollectorRegistry,
        *,
        capacity: int = CAPACITY,
        flush_every: float = FLUSH_EVERY_S,
    ) -> None:
        self._path = path
        self._sample_rate = sample_rate
        self._capacity = capacity
        self._flush_every = flush_every
        self._pending: collections.deque[_Entry] = collections.deque()
        self._out: IO[bytes] | None = None
        self._owned = False
        self._stopping = asyncio.Event()
        self._dropped = Counter(
            "fleet_proxy_request_log_dropped",
            "Request log lines dropped because the queue to the writer was full",
            registry=registry,
        )
        # With every request logged, no random number per request.
        self._every = sample_rate >= 1.0

    def open(self) -> None:
        """Open the file (append), or take stderr; an unwritable path stops start-up."""
        if self._path is None:
            self._out = sys.stderr.buffer
        else:
            self._out = self._path.open("ab")
            self._owned = True

    def sampled(self) -> bool:
        return self._every or random.random() < self._sample_rate

    def record(
        self,
        endpoint: str,
        request_id: str,
        status: int,
        arrived: float,
        finished: FinishedRequest | None,
        flow: FlowTicket | None = None,
    ) -> None:
        pending = self._pending
        if len(pending) >= self._capacity:
            self._dropped.inc()
            return
        e2e = time.perf_counter() - arrived
        pending.append(_Entry(time.time(), e2e, endpoint, request_id, status, finished, flow))

    async def run(self) -> None:
        """Write the queue out every `flush_every` seconds until `stop()`, then the rest."""
        stopping = self._stopping
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._flush_every)
            await self.flush()

    async def flush(self) -> None:
        data = self._lines()
        if data:
            await asyncio.to_thread(self._write, data)

    def stop(self) -> None:
        """Ask `run` to write what is left and return."""
        self._stopping.set()

    def close(self) -> None:
        """Write anything still queued (once `run` has returned) and close the file."""
        data = self._lines()
        if data:
            self._write(data)
        if self._owned and self._out is not None:
            self._out.close()
        self._out = None

    def _lines(self) -> bytes:
        pending = self._pending
        if not pending:
            return b""
        out: list[bytes] = []
        while pending:
            out.append(orjson.dumps(entry_fields(pending.popleft())))
            out.append(b"\n")
        return b"".join(out)

    def _write(self, data: bytes) -> None:
        out = self._out
        if out is None:
            return
        with contextlib.suppress(OSError, ValueError):  # a closed stderr: nothing to do
            out.write(data)
            out.flush()


def entry_fields(e: _Entry) -> dict[str, Any]:
    arrived = datetime.datetime.fromtimestamp(e.wall_end - e.e2e, datetime.UTC)
    f = e.finished
    attempts = f.attempts if f is not None else 0
    fields: dict[str, Any] = {
        "time": arrived.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "request_id": e.request_id,
        "endpoint": e.endpoint,
        "model": f.model if f is not None else None,
        "stream": f.stream if f is not None else None,
        "status": e.status,
        "backends": f.backends if f is not None else [],
        "attempts": attempts,
        "retries": max(0, attempts - 1),
        "moves": f.moves if f is not None else 0,
        "ttft_ms": None if f is None or f.ttft is None else round(f.ttft * 1000.0, 3),
        "e2e_ms": round(e.e2e * 1000.0, 3),
        "prompt_tokens": None,
        "completion_tokens": None,
        "routed_prompt_tokens": f.routed_prompt_tokens if f is not None else None,
        "client_disconnect": e.status == 499,
    }
    flow = e.flow
    if flow is not None:
        fields["tenant"] = flow.tenant
        fields["priority"] = flow.priority
        fields["queue_wait_ms"] = round(flow.waited * 1000.0, 3)
    if f is None:
        return fields
    if f.answer is not None:
        fields.update(usage_counts(f.answer))
    if f.completion_tokens is not None:
        fields["completion_tokens"] = f.completion_tokens
    return fields
