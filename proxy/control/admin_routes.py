"""The admin API's router (`admin_router`): which path each admin handler answers, behind the
admin access check (proxy/control/admin_access.py).

The handlers live by concern: backends (proxy/control/admin_backends.py), live requests and
their moves (proxy/control/admin_requests.py), the state of workers, rescheduler, planner and
policy (proxy/control/admin_state.py). What they change, they change through
proxy/control/operations.py, as the colocated planner and the discovery loop do.

With several worker processes a change (add, remove, drain, undrain) reaches every worker
through `FleetChanges` (fleet/changes.py) and is answered once the receiving worker has
applied it; the GET endpoints answer from the receiving worker's own state.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends

from fleet.changes import FleetChanges, LocalChanges
from proxy.control.admin_access import AdminAccess
from proxy.control.admin_backends import BackendRoutes
from proxy.control.admin_requests import MIGRATE_REFUSED, RequestRoutes
from proxy.control.admin_state import FlowView, StateRoutes, StatusSource
from proxy.control.peer_sync import PeerSync
from proxy.errors import ErrorBody
from proxy.ports import ControlServices
from proxy.url_policy import UrlPolicy

# Refusals answer in the OpenAI shape (the app's exception handlers), never FastAPI's 422.
OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorBody, "description": "An OpenAI-shaped error"}
}


def admin_router(
    core: ControlServices,
    changes: FleetChanges | None = None,
    sync: PeerSync | None = None,
    planner: StatusSource | None = None,
    flow: FlowView | None = None,
) -> APIRouter:
    """`changes` defaults to changing this process's registry; `sync` is this worker's
    `PeerSync` when the proxy runs several; `planner` the colocated planner, if enabled;
    `flow` flow control, if configured."""
    s = core.settings
    access = AdminAccess(s.admin_token, s.host)
    url_policy = UrlPolicy.build(
        s.backend_url_allow, s.backend_url_schemes, s.backend_url_allow_link_local
    )
    backends = BackendRoutes(core, changes or LocalChanges(core.fleet), url_policy)
    live = RequestRoutes(core)
    state = StateRoutes(core, sync, planner, flow)

    r = APIRouter(prefix="/admin", dependencies=[Depends(access.check)], responses=OPENAI_ERRORS)
    # In this order: the OpenAPI schema lists the paths as they were added.
    r.add_api_route("/backends", backends.list_backends, methods=["GET"])
    r.add_api_route("/backends", backends.add_backend, methods=["POST"], status_code=201)
    r.add_api_route("/backends/{backend_id}", backends.remove_backend, methods=["DELETE"])
    r.add_api_route("/backends/{backend_id}/drain", backends.drain, methods=["POST"])
    r.add_api_route("/backends/{backend_id}/undrain", backends.undrain, methods=["POST"])
    r.add_api_route("/workers", state.workers, methods=["GET"])
    r.add_api_route("/requests", live.live_requests, methods=["GET"])
    r.add_api_route(
        "/requests/{request_id}/migrate", live.migrate, methods=["POST"], responses=MIGRATE_REFUSED
    )
    r.add_api_route("/backends/{backend_id}/evacuate", backends.evacuate, methods=["POST"])
    r.add_api_route("/rescheduler", state.rescheduler_state, methods=["GET"])
    r.add_api_route("/planner", state.planner_state, methods=["GET"])
    r.add_api_route("/rescheduler/view", state.rescheduler_view, methods=["GET"])
    r.add_api_route("/policy", state.policy_state, methods=["GET"])
    r.add_api_route("/programs/{program_id}", state.end_program, methods=["DELETE"])
    r.add_api_route("/flow", state.flow_state, methods=["GET"])
    return r
