"""The machine's load around a benchmark run: a figure measured on a busy machine says as much
about the other jobs as about the routing (one replay's TTFT p90 moved by 40% on a busy
machine), so every run records the load average before and after and says when it was busy."""

from __future__ import annotations

import os
from collections.abc import Mapping
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


def run_warnings(costs: Mapping[str, Any], label: str) -> list[str]:
    """The busy warnings of one run's recorded load (costs.json), naming the run."""
    n_cores = costs.get("cores") or cores()
    found = []
    for key, when in (("load_before", "before"), ("load_after", "after")):
        load = costs.get(key)
        if load and (w := busy_warning(load, n_cores, f"{when} {label}")):
            found.append(w)
    return found
