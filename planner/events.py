"""What the planner's runtime reports as it runs: `PlannerEvents`, called by `PlannerLoop` (each
metric pull, each due decision) and by connectors that drain (each drain), and the small
implementations that need no library: `NoEvents`, `FanOut` (several at once) and `Journal`
(the last sample and drains, for the status view).

Metrics (planner/metrics.py) and TensorBoard files (planner/tensorboard.py) implement it too.
An implementation must not raise: the loop calls it between its own steps.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Protocol

from planner.config import PlannerRole
from planner.decide import Decision, PlannerState
from planner.drain import DrainReport
from planner.observe import Sample


class PlannerEvents(Protocol):
    def on_sample(self, sample: Sample) -> None:
        """One metric pull's result."""
        ...

    def on_decision(self, decision: Decision, state: PlannerState, errors: tuple[str, ...]) -> None:
        """A due decision; `state` after any change was carried out (counts read back),
        `errors` the changes that failed."""
        ...

    def on_drain(self, role: PlannerRole, report: DrainReport) -> None:
        """A worker's drain ended (drained, or timed out and left up)."""
        ...


class NoEvents:
    def on_sample(self, sample: Sample) -> None:
        pass

    def on_decision(self, decision: Decision, state: PlannerState, errors: tuple[str, ...]) -> None:
        pass

    def on_drain(self, role: PlannerRole, report: DrainReport) -> None:
        pass


class FanOut:
    """Every event to each of `events`, in order."""

    def __init__(self, *events: PlannerEvents) -> None:
        self.events = events

    def on_sample(self, sample: Sample) -> None:
        for e in self.events:
            e.on_sample(sample)

    def on_decision(self, decision: Decision, state: PlannerState, errors: tuple[str, ...]) -> None:
        for e in self.events:
            e.on_decision(decision, state, errors)

    def on_drain(self, role: PlannerRole, report: DrainReport) -> None:
        for e in self.events:
            e.on_drain(role, report)


@dataclass(frozen=True, slots=True)
class DrainRecord:
    wall_time: float  # unix seconds
    role: PlannerRole
    report: DrainReport


class Journal(NoEvents):
    """The last sample and the last `keep` drains, as the status view shows them."""

    def __init__(self, keep: int = 10) -> None:
        self.last_sample: Sample | None = None
        self.drains: deque[DrainRecord] = deque(maxlen=keep)

    def on_sample(self, sample: Sample) -> None:
        self.last_sample = sample

    def on_drain(self, role: PlannerRole, report: DrainReport) -> None:
        self.drains.append(DrainRecord(time.time(), role, report))

    def status(self) -> dict[str, Any]:
        return {
            "last_sample": dataclasses.asdict(self.last_sample) if self.last_sample else None,
            "drains": [
                {**dataclasses.asdict(d), "requests": d.report.requests_by_fate()}
                for d in self.drains
            ],
        }
