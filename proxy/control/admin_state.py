"""The admin API's state handlers: the worker processes, the colocated rescheduler and planner,
the routing policy (and ending one of its programs). They answer from the receiving worker's
own state.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any, Protocol

from fastapi import HTTPException
from fastapi.responses import JSONResponse

from proxy.control.peer_sync import PeerSync
from proxy.ports import ControlServices
from rescheduler.observe import cluster_view
from rescheduler.wire import view_to_json


class StatusSource(Protocol):
    """What GET /admin/planner reads of the colocated planner."""

    def status(self) -> dict[str, Any]: ...


class FlowView(Protocol):
    """What GET /admin/flow reads of flow control."""

    def view(self) -> dict[str, Any]: ...


class StateRoutes:
    """The handlers of the admin API's state routes; their names are the routes' OpenAPI
    names. `sync` is this worker's `PeerSync` when the proxy runs several; `planner` the
    colocated planner, if enabled; `flow` flow control, if configured."""

    def __init__(
        self,
        core: ControlServices,
        sync: PeerSync | None,
        planner: StatusSource | None,
        flow: FlowView | None = None,
    ) -> None:
        self.core = core
        self.sync = sync
        self.planner = planner
        self.flow = flow

    async def flow_state(self) -> dict[str, Any]:
        """Flow control's queues in this worker: per model's pool its saturation and, per
        priority band (highest first), the requests waiting per tenant; and the attained
        service per program when ordering is `las`."""
        if self.flow is None:
            return {"enabled": False, "pools": {}}
        return {"enabled": True, **self.flow.view()}

    async def workers(self) -> dict[str, Any]:
        """The proxy's worker processes and the requests each has dispatched, from the shared
        segment (one row, this process, when it runs alone); and per backend the requests in
        flight from the answering worker and from its peers, as its policy sees them."""
        fleet = self.core.fleet
        backends = {
            b.id: {"in_flight": b.load.in_flight, "peer_in_flight": b.load.peer_in_flight}
            for b in fleet
        }
        sync = self.sync
        if sync is None:
            dispatched = sum(b.load.dispatched_total for b in fleet)
            routable = len(fleet.routable(self.core.clock.now()))
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
                    "flow_control_waiting": r.waiting,
                    "sync_steps": r.ticks,
                }
                for r in sync.rows()
            ],
            "backends": backends,
        }

    async def rescheduler_state(self) -> dict[str, Any]:
        """The colocated rescheduler's settings, its last cycles and its last cycles that
        planned a migration (oldest first)."""
        loop = self.core.rescheduler
        if loop is None:
            return {"enabled": False, "cycles": [], "migrating_cycles": []}
        return {
            "enabled": True,
            "interval_ms": self.core.settings.rescheduling_interval_ms,
            "config": asdict(loop.config),
            "cycles": [c.as_json() for c in loop.history()],
            "migrating_cycles": [c.as_json() for c in loop.migrating_history()],
        }

    async def planner_state(self) -> dict[str, Any]:
        """The colocated planner (`planner_enabled`): its settings, state, last sample, last
        decisions with their errors, and last drains (docs/planner.md)."""
        if self.planner is None:
            return {"enabled": False, "decisions": [], "drains": []}
        return {"enabled": True, **self.planner.status()}

    async def rescheduler_view(self) -> dict[str, Any]:
        """The fleet as the rescheduler's decision core sees it, with the answering worker's
        live requests: what a standalone rescheduler (`fleet-proxy reschedule`) decides on."""
        core = self.core
        return view_to_json(cluster_view(core.fleet, core.live, core.clock.now()))

    async def policy_state(self) -> dict[str, Any]:
        return {"name": self.core.policy.name, "stats": self.core.policy.stats()}

    async def end_program(self, program_id: str) -> JSONResponse:
        policy = self.core.policy
        if not policy.keeps_programs():
            raise HTTPException(status_code=409, detail=f"policy {policy.name!r} keeps no programs")
        if not policy.end_program(program_id):
            raise HTTPException(status_code=404, detail=f"no program {program_id!r}")
        return JSONResponse({"ended": program_id})
