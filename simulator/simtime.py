"""Engine time: a clock that can run faster than real time, and a way to wait on it.

`ScaledTime(speed=X)` runs X simulated seconds per real second; every timestamp and duration
the engine reports is in simulated seconds. `ManualTime` never sleeps: waiting jumps the clock,
so tests of the engine loop run as fast as the CPU allows.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class SimTime(Protocol):
    @property
    def speed(self) -> float: ...

    def now(self) -> float: ...

    async def sleep_until(self, t: float) -> None: ...

    def real_seconds(self, sim_seconds: float) -> float:
        """How long `sim_seconds` of engine time take in real time."""
        ...


class ScaledTime:
    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self._speed = speed
        self._origin = time.monotonic()

    @property
    def speed(self) -> float:
        return self._speed

    def now(self) -> float:
        return (time.monotonic() - self._origin) * self._speed

    async def sleep_until(self, t: float) -> None:
        delay = (t - self.now()) / self._speed
        await asyncio.sleep(delay if delay > 0 else 0)

    def real_seconds(self, sim_seconds: float) -> float:
        return sim_seconds / self._speed


class ManualTime:
    def __init__(self, start: float = 0.0) -> None:
        self._t = start

    @property
    def speed(self) -> float:
        return 1.0

    def now(self) -> float:
        return self._t

    def advance(self, seconds: float) -> None:
        self._t += seconds

    async def sleep_until(self, t: float) -> None:
        if t > self._t:
            self._t = t
        await asyncio.sleep(0)

    def real_seconds(self, sim_seconds: float) -> float:
        return 0.0
