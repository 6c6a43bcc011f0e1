"""Admin API: list, add, remove, drain and evacuate backends; live requests and their planned
moves; policy state.

Protected by the admin token when one is configured (`x-admin-token: <token>`; not
`Authorization`, which carries the client's API key on the OpenAI endpoints). With no token
configured it answers loopback clients only, and nobody when the proxy listens beyond
loopback. Backends added at run time must pass the URL
policy (proxy/url_policy.py).

With several worker processes a change (add, remove, drain, undrain) reaches every worker
through `FleetChanges` (fleet/changes.py) and is answered once the receiving worker has
applied it; the GET endpoints answer from the receiving worker's own state.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from dataclasses import asdict, replace
from typing import Any, Literal, Protocol

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from fleet.changes import FleetChanges, LocalChanges
from fleet.discovery import ADMIN
from fleet.live import LiveEntry, NotMovable
from fleet.outliers import EjectionState
from fleet.registry import DuplicateBackend
from fleet.types import Backend
from proxy.control.peer_sync import PeerSync
from proxy.errors import ErrorBody
from proxy.ports import ControlServices
from proxy.settings import BackendConfig
from proxy.url_policy import (
    UrlPolicy,
    is_loopback,
    listens_on_loopback,
    refuse_kv_events_reason,
    refuse_reason,
)
from rescheduler.observe import cluster_view
from rescheduler.wire import view_to_json


class MoveOrderBody(BaseModel):
    """A planned move: the target backend id (None: the routing policy chooses) and a reason
    that labels the move in the migration metrics."""

    model_config = ConfigDict(extra="forbid")

    to: str | None = None
    reason: str = Field(default="admin", min_length=1, max_length=64, pattern=r"^[a-z0-9_]+$")
    # Move it only if it is still on this backend (a rescheduler's view may be old):
    # otherwise 409 not_movable.
    source: str | None = None
    # How long to wait for the move (default: move_timeout); then it answers `pending`.
    timeout: float | None = Field(default=None, gt=0, le=600)
    # How the KV moves (proxy/stream/move_kinds.py); None: the `move_kind` setting.
    kind: Literal["auto", "recompute", "handover", "precopy"] | None = None


def backend_view(
    b: Backend, now: float, stale_after: float, ejection: EjectionState | None = None
) -> dict[str, Any]:
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


class StatusSource(Protocol):
    def status(self) -> dict[str, Any]: ...


async def move_one(
    core: ControlServices,
    entry: LiveEntry,
    to: Backend | None,
    reason: str,
    wait_s: float | None = None,
    kind: str | None = None,
) -> dict[str, Any]:
    """Move one live request; its outcome as the admin API reports it."""
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


def admin_router(
    core: ControlServices,
    changes: FleetChanges | None = None,
    sync: PeerSync | None = None,
    planner: StatusSource | None = None,
) -> APIRouter:
    """`changes` defaults to changing this process's registry; `sync` is this worker's
    `PeerSync` when the proxy runs several; `planner` the colocated planner, if enabled."""
    token = core.settings.admin_token
    fleet_changes: FleetChanges = changes or LocalChanges(core.fleet)
    settings = core.settings
    url_policy = UrlPolicy.build(
        settings.backend_url_allow,
        settings.backend_url_schemes,
        settings.backend_url_allow_link_local,
    )

    # Listening beyond loopback, the API is exposed whoever connects: a client address may be
    # loopback yet stand for anyone (a sidecar or reverse proxy on this host), so with no
    # token the listener's bind address decides, and an exposed one refuses everybody.
    exposed = not listens_on_loopback(settings.host)
    exposed_refusal = (
        f"the admin API is off: this proxy listens on {settings.host} and no admin_token is "
        "set; set one (admin_token in the config file, FLEET_PROXY_ADMIN_TOKEN, or "
        "--admin-token) and send it as x-admin-token"
    )

    def check_token(request: Request, x_admin_token: str | None = Header(default=None)) -> None:
        if token is None:
            if exposed:
                raise HTTPException(status_code=403, detail=exposed_refusal)
            client = request.client
            if client is None or not is_loopback(client.host):
                raise HTTPException(
                    status_code=403,
                    detail="the admin API answers only loopback clients when no admin_token is set",
                )
            return
        # As bytes: a header's value may hold any byte (the server decodes it as latin-1),
        # and compare_digest refuses non-ASCII str.
        if x_admin_token is None or not secrets.compare_digest(
            x_admin_token.encode("latin-1"), token.get_secret_value().encode("utf-8")
        ):
            raise HTTPException(status_code=401, detail="admin token missing or wrong")

    # Refusals answer in the OpenAI shape (the app's exception handlers), never FastAPI's 422.
    errors: dict[int | str, dict[str, Any]] = {
        "4XX": {"model": ErrorBody, "description": "An OpenAI-shaped error"}
    }
    router = APIRouter(prefix="/admin", dependencies=[Depends(check_token)], responses=errors)

    def view(b: Backend) -> dict[str, Any]:
        ejection = core.ejection.detector.state(b.id)
        return backend_view(b, core.clock.now(), core.fleet.stale_after, ejection)

    @router.get("/backends")
    async def list_backends() -> list[dict[str, Any]]:
        return [view(b) for b in core.fleet]

    @router.post("/backends", status_code=201)
    async def add_backend(config: BackendConfig) -> dict[str, Any]:
        refused = await refuse_reason(url_policy, config.url)
        if refused is not None:
            raise HTTPException(status_code=403, detail=f"backend url refused: {refused}")
        for endpoint in (config.kv_events_endpoint, config.kv_events_replay_endpoint):
            refused = await refuse_kv_events_reason(url_policy, endpoint) if endpoint else None
            if refused is not None:
                raise HTTPException(
                    status_code=403, detail=f"KV-events endpoint refused: {refused}"
                )
        try:
            b = await fleet_changes.add(replace(config.to_spec(), source=ADMIN))
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
        return [r.view() for r in core.live]

    def backend_or_404(backend_id: str) -> Backend:
        b = core.fleet.get(backend_id)
        if b is None:
            raise HTTPException(status_code=404, detail=f"no backend {backend_id!r}")
        return b

    @router.post(
        "/requests/{request_id}/migrate",
        responses={
            409: {
                "description": "The request did not move: its outcome and why",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    )
    async def migrate(request_id: str, order: MoveOrderBody | None = None) -> JSONResponse:
        """Move a running request to another backend (`to`, else the policy's choice),
        continuing its stream from the last token its client received. The request is named
        by its x-request-id or by its upstream request id (unique; what the rescheduler
        uses)."""
        order = order or MoveOrderBody()
        to = backend_or_404(order.to) if order.to is not None else None
        found = core.live.find(request_id)
        entry = found[0] if found else core.live.by_upstream_id(request_id)
        if entry is None:
            raise HTTPException(status_code=404, detail=f"no live request {request_id!r}")
        if order.source is not None and entry.backend_id != order.source:
            return JSONResponse(
                status_code=409,
                content={
                    "request_id": entry.request_id,
                    "outcome": "not_movable",
                    "detail": f"no longer on {order.source}",
                },
            )
        result = await move_one(core, entry, to, order.reason, order.timeout, order.kind)
        code = 200 if result["outcome"] in ("ok", "pending") else 409
        return JSONResponse(status_code=code, content=result)

    @router.post("/backends/{backend_id}/evacuate")
    async def evacuate(backend_id: str, drain: bool = True, reason: str = "evacuate") -> Any:
        """Move every movable live request off a backend, all at once; with `drain` (the
        default) the backend first stops taking new requests."""
        backend = backend_or_404(backend_id)
        return await evacuate_backend(core, fleet_changes, backend, drain=drain, reason=reason)

    @router.get("/rescheduler")
    async def rescheduler_state() -> dict[str, Any]:
        """The colocated rescheduler's settings, its last cycles and its last cycles that
        planned a migration (oldest first)."""
        loop = core.rescheduler
        if loop is None:
            return {"enabled": False, "cycles": [], "migrating_cycles": []}
        return {
            "enabled": True,
            "interval_ms": settings.rescheduling_interval_ms,
            "config": asdict(loop.config),
            "cycles": [c.as_json() for c in loop.history()],
            "migrating_cycles": [c.as_json() for c in loop.migrating_history()],
        }

    @router.get("/planner")
    async def planner_state() -> dict[str, Any]:
        """The colocated planner (`planner_enabled`): its settings, state, last sample, last
        decisions with their errors, and last drains (docs/planner.md)."""
        if planner is None:
            return {"enabled": False, "decisions": [], "drains": []}
        return {"enabled": True, **planner.status()}

    @router.get("/rescheduler/view")
    async def rescheduler_view() -> dict[str, Any]:
        """The fleet as the rescheduler's decision core sees it, with the answering worker's
        live requests: what a standalone rescheduler (`fleet-proxy reschedule`) decides on."""
        return view_to_json(cluster_view(core.fleet, core.live, core.clock.now()))

    @router.get("/policy")
    async def policy_state() -> dict[str, Any]:
        return {"name": core.policy.name, "stats": core.policy.stats()}

    @router.delete("/programs/{program_id}")
    async def end_program(program_id: str) -> JSONResponse:
        if not core.policy.keeps_programs():
            raise HTTPException(
                status_code=409, detail=f"policy {core.policy.name!r} keeps no programs"
            )
        if not core.policy.end_program(program_id):
            raise HTTPException(status_code=404, detail=f"no program {program_id!r}")
        return JSONResponse({"ended": program_id})

    return router
