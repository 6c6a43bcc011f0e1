"""Admission control: at most `max_concurrent_requests` OpenAI requests run at once per
serving process; past that, requests wait in a bounded queue, first come first served, and
beyond the queue (or after `admission_queue_timeout` in it) they get 429 with `Retry-After`.

Off unless `max_concurrent_requests` is set: `create_app` then wraps the hot-path handler in
`AdmittedHandler`; without it the handler runs as before, with no check at all.

A slot is handed from the request that leaves straight to the oldest waiter, so a request
arriving just then cannot overtake the queue. A queued request has not been read yet: its body
waits in the socket, and the count of waiting requests is what bounds the memory held.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from proxy.asgi import AsgiApp, Receive, Scope, Send, send_error
from proxy.errors import ProxyError
from proxy.ports import RequestLog
from proxy.request.routes import endpoint_name
from proxy.serving.wiring import ProxyCore

REJECT_REASONS = ("queue_full", "queue_timeout")
# What a refused client is told to wait before it tries again.
RETRY_AFTER_S = 1


class Admission(Protocol):
    """A bound on the requests running at once."""

    async def enter(self) -> None:
        """Wait for a slot; raises ProxyError(429) when the queue is full or the wait too long."""

    def leave(self) -> None:
        """Give back the slot `enter` gave."""


class AdmissionGate:
    """`max_running` slots and a queue of at most `max_waiting` requests."""

    def __init__(
        self,
        max_running: int,
        max_waiting: int,
        timeout: float,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.max_running = max_running
        self.max_waiting = max_waiting
        self.timeout = timeout
        self.running = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._rejected: dict[str, Counter] = {}
        if registry is not None:
            rejected = Counter(
                "fleet_proxy_admission_rejected",
                "Requests refused with 429 by admission control, by reason: queue_full (the "
                "admission queue was full), queue_timeout (waited admission_queue_timeout)",
                ["reason"],
                registry=registry,
            )
            for reason in REJECT_REASONS:  # each series from 0, for rates and alerts
                self._rejected[reason] = rejected.labels(reason)
            Gauge(
                "fleet_proxy_admission_waiting",
                "Requests waiting in the admission queue for a slot",
                registry=registry,
            ).set_function(lambda: self.waiting)
            Gauge(
                "fleet_proxy_admission_running",
                "Requests holding an admission slot (at most max_concurrent_requests)",
                registry=registry,
            ).set_function(lambda: self.running)
        full = f"{max_running} requests are running and {max_waiting} waiting, the limits"
        self._full = self._refusal(full + "; retry shortly", "queue_full")
        self._timed_out = self._refusal(
            f"no request slot freed within {timeout:g} s; retry shortly", "queue_timeout"
        )

    @staticmethod
    def _refusal(message: str, reason: str) -> ProxyError:
        # OpenAI's shape for rate limits: 429, type and code as its API answers them.
        return ProxyError(
            429,
            f"the proxy is at capacity: {message}",
            type="rate_limit_error",
            code=reason,
            headers=[(b"retry-after", str(RETRY_AFTER_S).encode())],
        )

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    async def enter(self) -> None:
        if self.running < self.max_running and not self._waiters:
            self.running += 1
            return
        if self.waiting >= self.max_waiting:
            self._reject("queue_full")
            raise self._full
        loop = asyncio.get_running_loop()
        slot: asyncio.Future[None] = loop.create_future()
        self._waiters.append(slot)
        expiry = loop.call_later(self.timeout, _expire, slot)
        try:
            await slot
        except asyncio.CancelledError:
            if slot.done() and not slot.cancelled():
                self.leave()  # handed a slot just as this request was cancelled
            raise
        except TimeoutError:
            self._reject("queue_timeout")
            raise self._timed_out from None
        finally:
            expiry.cancel()
            _discard(self._waiters, slot)  # expired or cancelled; a handed slot is gone already

    def leave(self) -> None:
        waiters = self._waiters
        while waiters:
            slot = waiters.popleft()
            if not slot.done():
                slot.set_result(None)  # the slot passes on: `running` stays
                return
        self.running -= 1

    def _reject(self, reason: str) -> None:
        counter = self._rejected.get(reason)
        if counter is not None:
            counter.inc()


def _expire(slot: asyncio.Future[None]) -> None:
    if not slot.done():
        slot.set_exception(TimeoutError())


def _discard(waiters: collections.deque[asyncio.Future[None]], slot: asyncio.Future[None]) -> None:
    with contextlib.suppress(ValueError):
        waiters.remove(slot)


class AdmittedHandler:
    """The hot-path handler behind an admission gate."""

    def __init__(self, inner: AsgiApp, gate: Admission, core: ProxyCore) -> None:
        self._inner = inner
        self._gate = gate
        self._metrics = core.metrics
        self._request_log: RequestLog | None = core.request_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        arrived = time.perf_counter()
        try:
            await self._gate.enter()
        except ProxyError as e:
            await send_error(send, e, "")
            endpoint = endpoint_name(scope["path"])
            self._metrics.count_request(endpoint, e.status)
            request_log = self._request_log
            if request_log is not None and request_log.sampled():
                request_log.record(endpoint, "", e.status, arrived, None)
            return
        try:
            await self._inner(scope, receive, send)
        finally:
            self._gate.leave()
