"""The event loop the benchmark client runs on (`fleet-proxy bench`, its campaign and
selfcheck)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TypeVar

T = TypeVar("T")


def run_loop(coro: Coroutine[object, object, T]) -> T:
    """Run on uvloop when installed (less client CPU per request), else asyncio's loop.
    asyncio.Runner turns the first Ctrl-C into a cancellation of the main task, which the
    campaign catches to write what it collected."""
    factory: Callable[[], asyncio.AbstractEventLoop] | None
    try:
        import uvloop

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvicorn[standard] brings uvloop
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)
