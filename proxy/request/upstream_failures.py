"""Telling a leg's failure that another backend may retry from an answer for the client.

A leg that fails before its answer's status line is a `RetryableUpstream`, and so is a 5xx
answer (read and closed): nothing of it reached the client, so the session may try another
backend.
"""

from __future__ import annotations

import logging

from fleet.types import Backend
from proxy.backends.health import BackendHealth
from proxy.backends.upstream import UpstreamError, UpstreamResponse
from proxy.errors import FailureKind

log = logging.getLogger("fleet_proxy.legs")

# Answers that say "this backend, now" rather than "this request": safe to try elsewhere.
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
# What an error answer's detail quotes of its body; little more of it is read or held.
_DETAIL_BYTES = 300


class RetryableUpstream(Exception):
    """A backend failed before anything of its answer reached the client."""

    def __init__(self, backend: Backend, kind: FailureKind, detail: str) -> None:
        super().__init__(f"{backend.id}: {detail}")
        self.backend = backend
        self.kind: FailureKind = kind


async def error_detail(resp: UpstreamResponse) -> str:
    """The start of an error answer's body, for its detail, the rest neither awaited nor
    held (a backend may send an error body of any size, or one that never ends)."""
    start = await resp.read_start(_DETAIL_BYTES)
    return start[:_DETAIL_BYTES].decode("utf-8", "replace")


async def refused(backend: Backend, resp: UpstreamResponse) -> RetryableUpstream:
    """The failure a RETRYABLE_STATUS answer stands for, its body read (for the detail) and
    its response released."""
    try:
        detail = await error_detail(resp)
    except UpstreamError as e:
        detail = str(e)
    finally:
        resp.release()
    return RetryableUpstream(backend, "status", f"HTTP {resp.status}: {detail}")


def report_failure(
    health: BackendHealth, request_id: str, e: RetryableUpstream, attempt: int, age: float
) -> None:
    """Log an attempt that failed before its answer and tell the backend's health owner."""
    log.warning(
        "request %s: attempt %d on %s failed after %.2fs (%s): %s",
        request_id, attempt, e.backend.id, age, e.kind, e,
    )  # fmt: skip
    health.failed_before_answer(e.backend, e.kind, str(e))
