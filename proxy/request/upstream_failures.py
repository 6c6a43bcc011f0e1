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
from proxy.errors import FailureKind, ProxyError

log = logging.getLogger("fleet_proxy.legs")

# Answers that say "this backend, now" rather than "this request": safe to try elsewhere.
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})
# What an error answer's detail quotes of its body; little more of it is read or held.
_DETAIL_BYTES = 300


class RetryableUpstream(Exception):
    """A backend failed before anything of its answer reached the client; `status`: its
    answer's, when it answered one."""

    def __init__(
        self, backend: Backend, kind: FailureKind, detail: str, status: int | None = None
    ) -> None:
        super().__init__(f"{backend.id}: {detail}")
        self.backend = backend
        self.kind: FailureKind = kind
        self.status = status


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
    return RetryableUpstream(backend, "status", f"HTTP {resp.status}: {detail}", resp.status)


def failed_in_a_row(before: int, kind: FailureKind, status: int | None) -> int:
    """How many backends in a row a request has made fail once one more failed under it,
    `before` before. A backend that timed out, dropped the connection or answered 500/502/504
    while serving it may have been made to (a prompt that wedges an engine does that to every
    engine it reaches); a refused connection or a 503 says the backend was down or full
    before it saw the request, and leaves the count as it was."""
    if kind == "connect" or kind == "connect_timeout" or status == 503:
        return before
    return before + 1


def failed_in_a_row_error(failed: int, last: str | None) -> ProxyError:
    """The answer to a request stopped after making `failed` backends fail in a row; `last`:
    the last failure, named when error_details allows."""
    message = (
        f"the request failed on {failed} backends in a row (a timeout, a dropped connection or "
        "a 5xx answer on each) and was not sent to another: it may be what makes them fail "
        "(max_backends_failed_in_a_row)"
    )
    if last is not None:
        message += f"; last error: {last}"
    return ProxyError(
        502,
        message,
        type="upstream_error",
        code=502,
    )


def report_suspect(
    health: BackendHealth, request_id: str, backend: Backend, kind: FailureKind, detail: str
) -> None:
    """Log a failure under a request that had just made another backend fail: counted, but
    not held against this backend."""
    log.warning(
        "request %s: %s failed too (%s) after another backend failed under this request, "
        "not held against it: %s",
        request_id, backend.id, kind, detail,
    )  # fmt: skip
    health.failed_under_suspect(backend, kind, detail)


def report_failure(
    health: BackendHealth, request_id: str, e: RetryableUpstream, attempt: int, age: float
) -> None:
    """Log an attempt that failed before its answer and tell the backend's health owner."""
    log.warning(
        "request %s: attempt %d on %s failed after %.2fs (%s): %s",
        request_id, attempt, e.backend.id, age, e.kind, e,
    )  # fmt: skip
    health.failed_before_answer(e.backend, e.kind, str(e))
