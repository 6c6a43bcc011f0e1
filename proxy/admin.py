"""Admin API: list, add, remove and drain backends; live requests; policy state.

Protected by the admin token when one is configured (`Authorization: Bearer <token>` or
`x-admin-token: <token>`).

With several worker processes a change (add, remove, drain, undrain) reaches every worker
through `FleetChanges` (proxy/peer_sync.py) and is answered once the receiving worker has
applied it; the GET endpoints answer from the receiving worker's own state.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException
from fastapi.responses import JSONResponse

from fleet.registry import DuplicateBackend
from fleet.types import Backend
from proxy.core import ProxyCore
from proxy.peer_sync import FleetChanges, LocalChanges, PeerSync
from proxy.settings import BackendConfig


def backend_view(b: Backend, now: float, stale_after: float) -> dict[str, Any]:
    snap = b.snapshot
    return {
        "id": b.id,
        "url": b.url,
        "role": b.role.value,
        "node": b.spec.node,
        "unit": b.spec.unit,
        "labels": dict(b.spec.labels),
        "models": list(b.spec.models),
        "healthy": b.healthy,
        "draining": b.draining,
        "routable": b.routable(now, stale_after),
        "last_error": b.last_error,
        "load": asdict(b.load),
        "metrics": asdict(snap.metrics) if snap else None,
        "snapshot_age_seconds": snap.age(now) if snap else None,
    }


def admin_router(
    core: ProxyCore, changes: FleetChanges | None = None, sync: PeerSync | None = None
) -> APIRouter:
    """`changes` defaults to changing this process's registry; `sync` is this worker's
    `PeerSync` when the proxy runs several."""
    token = core.settings.admin_token
    fleet_changes: FleetChanges = changes or LocalChanges(core.fleet)

    def check_token(
        authorization: str | None = Header(default=None),
        x_admin_token: str | None = Header(default=None),
    ) -> None:
        if token is None:
            return
        given = x_admin_token
        if given is None and authorization and authorization.lower().startswith("bearer "):
            given = authorization[7:]
        if given is None or not secrets.compare_digest(given, token.get_secret_value()):
            raise HTTPException(status_code=401, detail="admin token missing or wrong")

    router = APIRouter(prefix="/admin", dependencies=[Depends(check_token)])

    def view(b: Backend) -> dict[str, Any]:
        return backend_view(b, core.clock.now(), core.fleet.stale_after)

    @router.get("/backends")
    async def list_backends() -> list[dict[str, Any]]:
        return [view(b) for b in core.fleet]

    @router.post("/backends", status_code=201)
    async def add_backend(config: BackendConfig) -> dict[str, Any]:
        try:
            b = await fleet_changes.add(config.to_spec())
        except DuplicateBackend as e:
            raise HTTPException(status_code=409, detail=str(e)) from None
        return view(b)

    @router.delete("/backends/{backend_id}")
    async def remove_backend(backend_id: str) -> dict[str, Any]:
        b = await fleet_changes.remove(backend_id)
        if b is None:
            raise HTTPException(status_code=404, detail=f"no backend {backend_id!r}")
        # This worker's requests still running on it (each worker has its own).
        return {"removed": backend_id, "in_flight": b.load.in_flight}

    async def set_draining(backend_id: str, draining: bool) -> dict[str, Any]:
        b = await fleet_changes.set_draining(backend_id, draining)
        if b is None:
            raise HTTPException(status_code=404, detail=f"no backend {backend_id!r}")
        return view(b)

    @router.post("/backends/{backend_id}/drain")
    async def drain(backend_id: str) -> dict[str, Any]:
        return await set_draining(backend_id, True)

    @router.post("/backends/{backend_id}/undrain")
    async def undrain(backend_id: str) -> dict[str, Any]:
        return await set_draining(backend_id, False)

    @router.get("/workers")
    async def workers() -> dict[str, Any]:
        """The proxy's worker processes and the requests each has dispatched, from the shared
        segment (one row, this process, when it runs alone); and per backend the requests in
        flight from the answering worker and from its peers, as its policy sees them."""
        backends = {
            b.id: {"in_flight": b.load.in_flight, "peer_in_flight": b.load.peer_in_flight}
            for b in core.fleet
        }
        if sync is None:
            dispatched = sum(b.load.dispatched_total for b in core.fleet)
            routable = len(core.fleet.routable(core.clock.now()))
            rows = [
                {"worker": 0, "pid": os.getpid(), "dispatched": dispatched, "routable": routable}
            ]
            return {"workers": 1, "answered_by": 0, "rows": rows, "backends": backends}
        return {
            "workers": sync.peers.layout.workers,
            "answered_by": sync.worker,
            "rows": [
                {
                    "worker": r.worker,
                    "pid": r.pid,
                    "dispatched": r.dispatched,
                    "routable": r.routable,
                    "changes_applied_to": r.applied,
                }
                for r in sync.rows()
            ],
            "backends": backends,
        }

    @router.get("/requests")
    async def live_requests() -> list[dict[str, Any]]:
        return [
            {
                "request_id": r.request_id,
                "endpoint": r.endpoint,
                "model": r.model,
                "backend": r.backend_id,
                "stream": r.stream,
                "prompt_tokens": r.prompt_tokens,
                "events": r.events,
                "attempts": r.attempts,
                "first_token": r.first_token_at is not None,
            }
            for r in core.live
        ]

    @router.get("/policy")
    async def policy_state() -> dict[str, Any]:
        stats = getattr(core.policy, "stats", None)
        return {"name": core.policy.name, "stats": stats() if callable(stats) else {}}

    @router.delete("/programs/{program_id}")
    async def end_program(program_id: str) -> JSONResponse:
        end = getattr(core.policy, "end_program", None)
        if not callable(end):
            raise HTTPException(
                status_code=409, detail=f"policy {core.policy.name!r} keeps no programs"
            )
        if not end(program_id):
            raise HTTPException(status_code=404, detail=f"no program {program_id!r}")
        return JSONResponse({"ended": program_id})

    return router
