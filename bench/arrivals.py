"""Arrival schedules for open-loop replay."""

from __future__ import annotations

import dataclasses
import random

from bench.workload import Workload


def poisson_offsets(n: int, rate: float, seed: int) -> list[float]:
    """Offsets (s) of `n` arrivals of a Poisson process at `rate` per second, first at 0."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


def with_poisson_arrivals(workload: Workload, rate: float, seed: int) -> Workload:
    """The same sessions, re-timed as Poisson session arrivals."""
    offsets = poisson_offsets(len(workload.sessions), rate, seed)
    sessions = tuple(
        dataclasses.replace(s, arrival_s=t) for s, t in zip(workload.sessions, offsets, strict=True)
    )
    return dataclasses.replace(workload, sessions=sessions)
