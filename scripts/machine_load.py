"""The machine's load around a benchmark run: a figure measured on a busy machine says as much
about the other jobs as about the routing (one replay's TTFT p90 moved by 40% on a busy
machine), so every run records the load average before and after and says when it was busy."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any


def load_now() -> list[float]:
    """The 1-, 5- and 15-minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def cores() -> int:
    return os.cpu_count() or 1


def busy_warning(load: list[float], n_cores: int, when: str) -> str | None:
    """A warning when the 1-minute load exceeds the core count, else None."""
    if load[0] <= n_cores:
        return None
    return (
        f"warning: 1-minute load {load[0]:.1f} exceeds the {n_cores} cores {when}: other jobs "
        f"share this machine, so latencies measured now are not the routing's alone"
    )


def busy_summary(runs: Sequence[tuple[str, Mapping[str, Any]]]) -> str | None:
    """One warning naming every run whose recorded load (costs.json: load_before, load_after,
    cores) exceeded the cores before or after it; None when none did."""
    busy = []
    for label, costs in runs:
        n_cores = costs.get("cores") or cores()
        before, after = costs.get("load_before"), costs.get("load_after")
        if any(load and load[0] > n_cores for load in (before, after)):
            said = ", ".join(
                f"{load[0]:.1f} {when}"
                for load, when in ((before, "before"), (after, "after"))
                if load
            )
            busy.append(f"{label} ({said}, {n_cores} cores)")
    if not busy:
        return None
    return (
        f"warning: the 1-minute load exceeded the core count around {len(busy)} of {len(runs)} "
        f"runs: {'; '.join(busy)}. Other jobs shared the machine; latencies measured then are "
        "not the routing's alone."
    )
