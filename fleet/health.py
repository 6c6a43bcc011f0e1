"""Active health: the rule that turns health-check results into a backend's health, and the
port the health checks report through.

fleet/ only judges here. The proxy's one owner of backend health applies the verdicts, with
everything else it knows about a backend (requests' failures, ejections); the health checks
(fleet/scrape.py) report each result to it and change no backend themselves.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from fleet.types import Backend


class HealthReports(Protocol):
    """Where the health checks report each result."""

    def check_passed(self, backend: Backend) -> None:
        """The backend's health path answered 200."""

    def check_failed(self, backend: Backend, detail: str) -> None:
        """It answered otherwise, or not at all; `detail` says how."""


@dataclass(frozen=True, slots=True)
class CheckVerdict:
    healthy: bool
    failures: int  # failed checks in a row, this one included
    went_down: bool  # this check reached the threshold


def judge_check(ok: bool, healthy: bool, failures: int, unhealthy_after: int) -> CheckVerdict:
    """A backend's health after one check.

    `healthy`: its health before the check; `failures`: failed checks in a row before it.
    A pass makes it healthy at once; `unhealthy_after` failures in a row take it out, so one
    slow answer while this process is busy does not empty the fleet. A backend that is out
    already (a refused request, or new and not yet checked) stays out until a pass.
    `went_down` when the failures reach the threshold, even if it was out already: the
    requests still on it must leave it then.
    """
    failures = 0 if ok else failures + 1
    return CheckVerdict(
        healthy=ok or (healthy and failures < unhealthy_after),
        failures=failures,
        went_down=not ok and failures == unhealthy_after,
    )


def failure_detail(e: BaseException) -> str:
    """An exception as a failed check's detail, with the system's reason when one caused it:
    httpx says "All connection attempts failed" for a refused connection and a missing host
    alike, the OSError under it tells them apart (`... (connection refused)`)."""
    said = f"{type(e).__name__}: {e}"
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OSError) and cause.errno is not None:
            return f"{said} ({os.strerror(cause.errno).lower()})"
        cause = cause.__cause__ or cause.__context__
    return said
