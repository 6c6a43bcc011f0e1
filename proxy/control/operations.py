"""What can be done to the fleet from inside the proxy, as plain functions: add, remove, drain
and undrain a backend, move one live request, evacuate a backend.

The admin API's handlers call them, and so do the colocated planner (`InProcessAdmin`) and the
discovery loop, so an operation behaves the same whoever asks. They know nothing of HTTP: a
missing backend is `NoBackend`, and each caller says it in its own terms.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, replace
from typing import Any

from fleet.changes import FleetChanges
from fleet.discovery import ADMIN
from fleet.live import LiveEntry, LiveTable, NotMovable
from fleet.registry import FleetRegistry
from fleet.types import Backend, BackendSpec
from proxy.ports import ControlServices

# A move's reason labels fleet_proxy_migrations_total: a closed alphabet and length keep the
# series few (free text would add one series per distinct string).
MOVE_REASON_PATTERN = r"^[a-z0-9_]+$"
MOVE_REASON_MAX = 64


class NoBackend(KeyError):
    """No backend has this id."""

    def __init__(self, backend_id: str) -> None:
        self.message = f"no backend {backend_id!r}"
        super().__init__(self.message)


def known_backend(fleet: FleetRegistry, backend_id: str) -> Backend:
    """The backend `backend_id`; NoBackend when there is none."""
    backend = fleet.get(backend_id)
    if backend is None:
        raise NoBackend(backend_id)
    return backend


async def add_backend(changes: FleetChanges, spec: BackendSpec) -> Backend:
    """Add a backend by hand (the admin API's or the planner's). Tagged as such, so that
    discovery's reconciling leaves it alone. DuplicateBackend when the id is taken."""
    return await changes.add(replace(spec, source=ADMIN))


async def remove_backend(changes: FleetChanges, backend_id: str) -> Backend | None:
    """The backend removed, None if there was none. Its requests still running finish."""
    return await changes.remove(backend_id)


async def set_draining(changes: FleetChanges, backend_id: str, draining: bool) -> Backend:
    """Drain a backend (no new requests) or undrain it; NoBackend when there is none."""
    backend = await changes.set_draining(backend_id, draining)
    if backend is None:
        raise NoBackend(backend_id)
    return backend


def takers_besides(fleet: FleetRegistry, backend: Backend, now: float) -> list[Backend]:
    """The routable backends other than `backend` that serve one of its models (any, while its
    models are not known): where its requests could move to, and what would still serve its
    models' new requests once it drains."""
    models = set(backend.spec.models)
    return [
        b
        for b in fleet.routable(now)
        if b.id != backend.id and (not models or models.intersection(b.spec.models))
    ]


def find_live_request(live: LiveTable, request_id: str) -> LiveEntry | None:
    """A live request by its x-request-id, else by its upstream request id (unique; what the
    rescheduler names requests by)."""
    found = live.find(request_id)
    return found[0] if found else live.by_upstream_id(request_id)


async def move_one(
    core: ControlServices,
    entry: LiveEntry,
    to: Backend | None,
    reason: str,
    wait_s: float | None = None,
    kind: str | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Move one live request to `to` (None: the routing policy chooses), waiting at most
    `wait_s` (default: the move_timeout setting); with `source`, only if it is still there (a
    rescheduler's view may be old). Its outcome as the admin API reports it: ok, pending
    (still moving), not_movable, or how the move failed."""
    if source is not None and entry.backend_id != source:
        detail = f"no longer on {source}"
        return {"request_id": entry.request_id, "outcome": "not_movable", "detail": detail}
    try:
        result = await asyncio.wait_for(
            entry.move(to, reason, kind=kind), timeout=wait_s or core.settings.move_timeout
        )
    except NotMovable as e:
        return {"request_id": entry.request_id, "outcome": "not_movable", "detail": e.reason}
    except TimeoutError:
        return {"request_id": entry.request_id, "outcome": "pending", "detail": "still moving"}
    return {"request_id": entry.request_id, **asdict(result)}


async def evacuate_backend(
    core: ControlServices,
    changes: FleetChanges,
    backend: Backend,
    *,
    drain: bool = True,
    reason: str = "evacuate",
) -> dict[str, Any]:
    """Move every movable live request off `backend`, all at once; with `drain` it first
    stops taking new requests. What POST /admin/backends/{id}/evacuate answers."""
    if drain:
        await changes.set_draining(backend.id, True)
    entries = core.live.on_backend(backend.id)
    results = await asyncio.gather(*(move_one(core, e, None, reason) for e in entries))
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    return {
        "backend": backend.id,
        "draining": backend.draining,
        "requests": len(entries),
        "outcomes": counts,
        "results": results,
    }
