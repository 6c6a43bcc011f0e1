"""Opening a leg's request on a backend, and telling a failure worth another backend from an
answer for the client.

A leg that fails before its answer's status line raises `RetryableUpstream` (so does a 5xx
answer, read and closed): nothing of it reached the client, so the session may try another
backend.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fleet.types import Backend
from proxy.backends.health import BackendHealth
from proxy.backends.upstream import UpstreamError, UpstreamResponse, failure_kind, split_url
from proxy.errors import FailureKind
from proxy.ports import RequestServices

log = logging.getLogger("fleet_proxy.legs")

# Answers that say "this backend, now" rather than "this request": safe to try elsewhere.
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})


class RetryableUpstream(Exception):
    """A backend failed before anything of its answer reached the client."""

    def __init__(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{backend.id}: {detail}")
        self.backend = backend
        self.kind: FailureKind = kind


class UpstreamOpener:
    """Sends a leg's request through the proxy's forwarding client, to the right URL."""

    __slots__ = ("_core", "_splits")

    def __init__(self, core: RequestServices) -> None:
        self._core = core
        self._splits: dict[str, tuple[str, str]] = {}  # backend URL -> (origin, path prefix)
        core.fleet.on_removed(lambda _: self._splits.clear())  # rebuilt as requests come

    def target(self, backend: Backend, path: str) -> tuple[str, str]:
        """The origin and full path of `path` on `backend` (its URL may carry a prefix)."""
        split = self._splits.get(backend.url)
        if split is None:
            split = self._splits[backend.url] = split_url(backend.url)
        origin, prefix = split
        return origin, prefix + path

    async def request(
        self,
        backend: Backend,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        """Open `path` on `backend`; a failure before the status line, or a 5xx answer, is a
        `RetryableUpstream`. `on_sent`: see UpstreamPool.request."""
        origin, full_path = self.target(backend, path)
        try:
            resp = await self._core.upstream_pool().request(
                origin, full_path, headers, body, on_sent=on_sent
            )
        except UpstreamError as e:
            raise RetryableUpstream(backend, failure_kind(e), str(e)) from None
        status = resp.status
        if status in RETRYABLE_STATUS:
            try:
                detail = (await resp.read())[:300].decode("utf-8", "replace")
            except UpstreamError as e:
                detail = str(e)
            finally:
                resp.release()
            raise RetryableUpstream(backend, "status", f"HTTP {status}: {detail}")
        return resp


def report_failure(
    health: BackendHealth, request_id: str, e: RetryableUpstream, attempt: int, age: float
) -> None:
    """Log an attempt that failed before its answer and tell the backend's health owner."""
    log.warning(
        "request %s: attempt %d on %s failed after %.2fs (%s): %s",
        request_id, attempt, e.backend.id, age, e.kind, e,
    )  # fmt: skip
    health.failed_before_answer(e.backend, e.kind, str(e))
