"""Wait for an outcome with a bounded poll: a generous bound on a wait, never a timed
assertion, so a loaded machine only makes a test slower, not red.

`eventually` waits on the event loop (its check may be a coroutine function);
`eventually_blocking` waits in a plain thread (a synchronous test driving servers that run
elsewhere). Both return the check's first truthy value, so a wait can hand back what it waited
for (a row, the lines of a file), and fail naming what was awaited and the last value seen.
`holds_within` and `holds_within_blocking` answer whether it came true instead, for a test
that takes another path when it did not (a stream that ended first, say).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


async def _poll(cond: Callable[[], Any], within: float, every: float) -> Any:
    """The check's first truthy value, or its last falsy one once `within` seconds pass."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got or loop.time() > deadline:
            return got
        await asyncio.sleep(every)


def _poll_blocking(cond: Callable[[], T], within: float, every: float) -> T:
    deadline = time.monotonic() + within
    while True:
        got = cond()
        if got or time.monotonic() > deadline:
            return got
        time.sleep(every)


def _timed_out(what: str, within: float, last: object) -> AssertionError:
    return AssertionError(f"{what} not reached within {within} s (last seen: {last!r})")


@overload
async def eventually(
    cond: Callable[[], Awaitable[T | None]],
    within: float = ...,
    what: str = ...,
    every: float = ...,
) -> T: ...


@overload
async def eventually(
    cond: Callable[[], T | None],
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
    got = await _poll(cond, within, every)
    if not got:
        raise _timed_out(what, within, got)
    return got


def eventually_blocking(
    cond: Callable[[], T | None],
    within: float = 10.0,
    what: str = "condition",
    every: float = 0.02,
) -> T:
    """`eventually` for a thread without an event loop: blocks between polls."""
    got = _poll_blocking(cond, within, every)
    if not got:
        raise _timed_out(what, within, got)
    return got


async def holds_within(
    cond: Callable[[], bool | Awaitable[bool]], within: float = 10.0, every: float = 0.01
) -> bool:
    """Whether `cond` (plain or async) came true within `within` seconds."""
    return bool(await _poll(cond, within, every))


def holds_within_blocking(
    cond: Callable[[], bool], within: float = 10.0, every: float = 0.02
) -> bool:
    """Whether `cond` came true within `within` seconds, blocking between polls."""
    return bool(_poll_blocking(cond, within, every))
