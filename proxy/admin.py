"""Admin API: list, add, remove and drain backends; live requests; policy state.

Protected by the admin token when one is configured (`Authorization: Bearer <token>` or
`x-admin-token: <token>`).
"""

from __future__ import annotations

import secrets
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, Header, HTTPException
from fastapi.responses import JSONResponse

from fleet.registry import DuplicateBackend
from fleet.types import Backend
from proxy.core import ProxyCore
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


def admin_router(core: ProxyCore) -> APIRouter:
    token = core.settings.admin_token

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

    def find(backend_id: str) -> Backend:
        b = core.fleet.get(backend_id)
        if b is None:
            raise HTTPException(status_code=404, detail=f"no backend {backend_id!r}")
        return b

    @router.get("/backends")
    async def list_backends() -> list[dict[str, Any]]:
        return [view(b) for b in core.fleet]

    @router.post("/backends", status_code=201)
    async def add_backend(config: BackendConfig) -> dict[str, Any]:
        try:
            b = core.fleet.add(config.to_spec())
        except DuplicateBackend as e:
            raise HTTPException(status_code=409, detail=str(e)) from None
        # Not routable until its first health check, models and scrape: the scraper does them.
        b.healthy = False
        return view(b)

    @router.delete("/backends/{backend_id}")
    async def remove_backend(backend_id: str) -> dict[str, Any]:
        b = find(backend_id)
        core.fleet.remove(backend_id)
        return {"removed": backend_id, "in_flight": b.load.in_flight}

    @router.post("/backends/{backend_id}/drain")
    async def drain(backend_id: str) -> dict[str, Any]:
        b = find(backend_id)
        b.draining = True
        return view(b)

    @router.post("/backends/{backend_id}/undrain")
    async def undrain(backend_id: str) -> dict[str, Any]:
        b = find(backend_id)
        b.draining = False
        return view(b)

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
