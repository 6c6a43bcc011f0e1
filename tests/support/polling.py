"""Wait for an outcome with a bounded poll: a generous bound on a wait, never a timed
assertion, so a loaded machine only makes a test slower, not red.

`eventually` waits on the event loop (its check may be a coroutine function);
`eventually_blocking` waits in a plain thread (a synchronous test driving servers that run
elsewhere). Both return the check's first truthy value, so a wait can hand back what it waited
for (a row, the lines of a file), and fail naming what was awaited and the last value seen.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


def _timed_out(what: str, within: float, last: object) -> AssertionError:
    return AssertionError(f"{what} not reached within {within} s (last seen: {last!r})")


@overload
async def eventually(
    cond: Callable[[], Awaitable[T]],
    within: float = ...,
    what: str = ...,
    every: float = ...,
) -> T: ...


@overload
async def eventually(
    cond: Callable[[], T],
    within: float = ...,
    what: str = ...,
    every: float = ...,
) -> T: ...


async def eventually(
    cond: Callable[[], Any],
    within: float = 10.0,
    what: str = "condition",
    every: float = 0.01,
) -> Any:
    """Poll `cond` (plain or async) every `every` seconds until it returns a truthy value, and
    return that value; fail after `within` seconds. `every=0` polls once per scheduler turn."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if loop.time() > deadline:
            raise _timed_out(what, within, got)
        await asyncio.sleep(every)


def eventually_blocking(
    cond: Callable[[], T],
    within: float = 10.0,
    what: str = "condition",
    every: float = 0.02,
) -> T:
    """`eventually` for a thread without an event loop: blocks between polls."""
    deadline = time.monotonic() + within
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise _timed_out(what, within, got)
        time.sleep(every)
