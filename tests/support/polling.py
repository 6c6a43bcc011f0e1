"""Wait for an outcome with a bounded poll: a generous bound on a wait, never a timed
assertion, so a loaded machine only makes a test slower, not red."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable


async def eventually(
    cond: Callable[[], bool | Awaitable[bool]],
    within: float = 10.0,
    what: str = "condition",
    every: float = 0.01,
) -> None:
    """Poll `cond` (plain or async) every `every` seconds until it holds; fail after
    `within` seconds."""
    deadline = asyncio.get_running_loop().time() + within
    while True:
        got = cond()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"{what} not reached within {within} s")
        await asyncio.sleep(every)
