"""The fleet changes the admin API (and discovery, and the planner) make, and their one-process
implementation.

With one worker `LocalChanges` changes the registry directly; with `--workers N`
proxy/control/peer_sync.py's `SharedChanges` appends each change to the shared log and answers once
this worker has applied it, so every worker holds the same fleet.
"""

from __future__ import annotations

from typing import Protocol

from fleet.registry import FleetRegistry
from fleet.types import Backend, BackendSpec


class FleetChanges(Protocol):
    """The fleet changes the admin API makes."""

    async def add(self, spec: BackendSpec) -> Backend:
        """Raises DuplicateBackend when the id is taken."""
        ...

    async def remove(self, backend_id: str) -> Backend | None: ...

    async def set_draining(self, backend_id: str, draining: bool) -> Backend | None: ...

    async def update(self, spec: BackendSpec) -> Backend | None:
        """Replace the spec of the backend `spec.id` in place (fleet/registry.py `update`)."""
        ...


def add_backend(fleet: FleetRegistry, spec: BackendSpec) -> Backend:
    # Not routable until its first health check, models and scrape: the scraper does them.
    return fleet.add(spec, unchecked=True)


class LocalChanges:
    """One process: change the registry directly."""

    def __init__(self, fleet: FleetRegistry) -> None:
        self.fleet = fleet

    async def add(self, spec: BackendSpec) -> Backend:
        return add_backend(self.fleet, spec)

    async def remove(self, backend_id: str) -> Backend | None:
        return self.fleet.remove(backend_id)

    async def set_draining(self, backend_id: str, draining: bool) -> Backend | None:
        return self.fleet.set_draining(backend_id, draining)

    async def update(self, spec: BackendSpec) -> Backend | None:
        return self.fleet.update(spec)
