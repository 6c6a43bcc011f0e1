"""The admin API's backend handlers: list, add, remove, drain, undrain and evacuate backends,
and `backend_view`, how a backend reads in their answers.

Each change goes through `FleetChanges` (with several workers, to every worker) by way of
proxy/control/operations.py; backends added here must pass the URL policy
(proxy/url_policy.py).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from fastapi import HTTPException, Query

from fleet.changes import FleetChanges
from fleet.outliers import EjectionState
from fleet.registry import DuplicateBackend, FleetRegistry
from fleet.types import Backend
from proxy.control import operations
from proxy.control.operations import MOVE_REASON_MAX, MOVE_REASON_PATTERN, NoBackend
from proxy.ports import ControlServices
from proxy.settings import BackendConfig
from proxy.url_policy import UrlPolicy, refuse_kv_events_reason, refuse_reason


def backend_view(
    b: Backend, now: float, stale_after: float, ejection: EjectionState | None = None
) -> dict[str, Any]:
    """A backend as the admin API shows it (and `HttpProxyAdmin` reads it)."""
    snap = b.snapshot
    return {
        "id": b.id,
        "url": b.url,
        "role": b.role.value,
        "node": b.spec.node,
        "unit": b.spec.unit,
        "labels": dict(b.spec.labels),
        "source": b.spec.source,
        "instance": b.spec.instance,
        "kv_events_endpoint": b.spec.kv_events_endpoint or None,
        "kv_events_replay_endpoint": b.spec.kv_events_replay_endpoint or None,
        "models": list(b.spec.models),
        "healthy": b.healthy,
        "draining": b.draining,
        "routable": b.routable(now, stale_after),
        "last_error": b.last_error,
        "ejection": (
            {
                "reason": ejection.reason,
                "seconds_left": max(0.0, ejection.until - now),
                "in_a_row": ejection.ejections,
            }
            if ejection is not None
            else None
        ),
        "load": asdict(b.load),
        "metrics": asdict(snap.metrics) if snap else None,
        "snapshot_age_seconds": snap.age(now) if snap else None,
    }


def not_found(e: NoBackend) -> HTTPException:
    return HTTPException(status_code=404, detail=e.message)


def backend_or_404(fleet: FleetRegistry, backend_id: str) -> Backend:
    try:
        return operations.known_backend(fleet, backend_id)
    except NoBackend as e:
        raise not_found(e) from None


class BackendRoutes:
    """The handlers of /admin/backends/...; their names are the routes' OpenAPI names."""

    def __init__(self, core: ControlServices, changes: FleetChanges, url_policy: UrlPolicy) -> None:
        self.core = core
        self.changes = changes
        self.url_policy = url_policy

    def view(self, b: Backend) -> dict[str, Any]:
        ejection = self.core.health.ejection_state(b.id)
        return backend_view(b, self.core.clock.now(), self.core.fleet.stale_after, ejection)

    async def list_backends(self) -> list[dict[str, Any]]:
        return [self.view(b) for b in self.core.fleet]

    async def add_backend(self, config: BackendConfig) -> dict[str, Any]:
        await self.refuse_urls(config)
        try:
            b = await operations.add_backend(self.changes, config.to_spec())
        except DuplicateBackend as e:
            raise HTTPException(status_code=409, detail=str(e)) from None
        return self.view(b)

    async def refuse_urls(self, config: BackendConfig) -> None:
        """403 when the URL policy refuses the backend's URL or a KV-events endpoint."""
        refused = await refuse_reason(self.url_policy, config.url)
        if refused is not None:
            raise HTTPException(status_code=403, detail=f"backend url refused: {refused}")
        for endpoint in (config.kv_events_endpoint, config.kv_events_replay_endpoint):
            if endpoint:
                refused = await refuse_kv_events_reason(self.url_policy, endpoint)
                if refused is not None:
                    raise HTTPException(
                        status_code=403, detail=f"KV-events endpoint refused: {refused}"
                    )

    async def remove_backend(self, backend_id: str) -> dict[str, Any]:
        b = await operations.remove_backend(self.changes, backend_id)
        if b is None:
            raise not_found(NoBackend(backend_id))
        # This worker's requests still running on it (each worker has its own).
        return {"removed": backend_id, "in_flight": b.load.in_flight}

    async def drain(self, backend_id: str) -> dict[str, Any]:
        return await self.set_draining(backend_id, True)

    async def undrain(self, backend_id: str) -> dict[str, Any]:
        return await self.set_draining(backend_id, False)

    async def set_draining(self, backend_id: str, draining: bool) -> dict[str, Any]:
        try:
            b = await operations.set_draining(self.changes, backend_id, draining)
        except NoBackend as e:
            raise not_found(e) from None
        return self.view(b)

    async def evacuate(
        self,
        backend_id: str,
        drain: bool = True,
        reason: Annotated[
            str, Query(min_length=1, max_length=MOVE_REASON_MAX, pattern=MOVE_REASON_PATTERN)
        ] = "evacuate",
    ) -> Any:
        """Move every movable live request off a backend, all at once; with `drain` (the
        default) the backend first stops taking new requests. 409, changing nothing, when no
        other routable backend serves its models: nothing could move, and draining it would
        leave its models unserved."""
        backend = backend_or_404(self.core.fleet, backend_id)
        if not operations.takers_besides(self.core.fleet, backend, self.core.clock.now()):
            raise HTTPException(
                status_code=409,
                detail=(
                    f"cannot evacuate backend {backend_id!r}: no other routable backend serves "
                    "its models, so nothing could move; drain it (POST "
                    f"/admin/backends/{backend_id}/drain) to stop it taking new requests anyway"
                ),
            )
        return await operations.evacuate_backend(
            self.core, self.changes, backend, drain=drain, reason=reason
        )
