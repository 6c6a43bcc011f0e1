"""Trying a first leg again after it failed before its answer: on another backend (the
attempt chooses), up to `max_attempts` in all, with a short jittered wait between tries."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from proxy.errors import ProxyError
from proxy.metrics import RouterMetrics
from proxy.request.upstream_failures import RetryableUpstream
from proxy.settings import Settings

T = TypeVar("T")


async def tried_again(
    attempt: Callable[[], Awaitable[T]],
    first: RetryableUpstream,
    note_failure: Callable[[RetryableUpstream], ProxyError | None],
    tried: list[str],
    settings: Settings,
    metrics: RouterMetrics,
) -> T:
    """`attempt` again after the first one failed with `first` (already noted); raises a 502
    once every attempt failed, when no backend is left to try (a 503 from choosing one), or
    when `note_failure` returns the error that stops the request."""
    last = first
    if settings.max_attempts <= 1:
        raise _exhausted(tried, last, settings.error_details)
    retrying = AsyncRetrying(
        stop=stop_after_attempt(settings.max_attempts - 1),
        retry=retry_if_exception_type(RetryableUpstream),
        wait=wait_random_exponential(multiplier=0.01, max=0.2),
        reraise=True,
    )
    try:
        async for tried_once in retrying:
            with tried_once:
                metrics.retries.labels(last.kind).inc()
                try:
                    return await attempt()
                except RetryableUpstream as e:
                    stop = note_failure(e)
                    if stop is not None:
                        raise stop from None  # the request, not the backends, looks at fault
                    last = e
                    raise
    except RetryableUpstream:
        pass
    except ProxyError as e:
        if e.status != 503:
            raise
    raise _exhausted(tried, last, settings.error_details)


def _exhausted(tried: list[str], last: RetryableUpstream, details: bool) -> ProxyError:
    message = f"no backend answered after {len(tried)} attempt(s)"
    if details:
        message += f" ({', '.join(tried)}); last error: {last}"
    return ProxyError(502, message, type="upstream_error", code=502)
