"""How the planner changes the fleet: a declarative `Connector` (`set_replicas(role, n)`) and
what it reports of the workers it sees, plus `FakeConnector`, an in-memory one for tests.

A connector is told how many workers a role should have, not which to start or stop: which
worker leaves on a scale-down (the cheapest to drain) is the connector's choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from planner.config import PlannerRole


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    id: str  # the worker's backend id at the proxy
    url: str
    role: PlannerRole
    managed: bool = True  # started by this connector, so it may stop it


class Connector(Protocol):
    async def set_replicas(self, role: PlannerRole, n: int) -> None:
        """Bring `role` to `n` workers; returns once the change is done (or raises)."""
        ...

    async def workers(self, role: PlannerRole) -> list[WorkerInfo]:
        """The workers of `role` serving now (those being removed excluded)."""
        ...


@dataclass
class FakeConnector:
    """Workers as names in memory; records every `set_replicas` call."""

    replicas: dict[PlannerRole, int] = field(default_factory=dict)
    calls: list[tuple[PlannerRole, int]] = field(default_factory=list)

    async def set_replicas(self, role: PlannerRole, n: int) -> None:
        self.calls.append((role, n))
        self.replicas[role] = n

    async def workers(self, role: PlannerRole) -> list[WorkerInfo]:
        return [
            WorkerInfo(f"{role}-{i}", f"http://127.0.0.1/{role}-{i}", role)
            for i in range(self.replicas.get(role, 0))
        ]
