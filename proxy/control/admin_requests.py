"""The admin API's live-request handlers: list the answering worker's live requests, and move
one of them (`MoveOrderBody`, what a planned move says) through proxy/control/operations.py.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from fleet.live import LiveEntry
from proxy.control import operations
from proxy.control.admin_backends import backend_or_404
from proxy.ports import ControlServices


class MoveOrderBody(BaseModel):
    """A planned move: the target backend id (None: the routing policy chooses) and a reason
    that labels the move in the migration metrics."""

    model_config = ConfigDict(extra="forbid")

    to: str | None = None
    reason: str = Field(
        default="admin",
        min_length=1,
        max_length=operations.MOVE_REASON_MAX,
        pattern=operations.MOVE_REASON_PATTERN,
    )
    # Move it only if it is still on this backend (a rescheduler's view may be old):
    # otherwise 409 not_movable.
    source: str | None = None
    # How long to wait for the move (default: move_timeout); then it answers `pending`.
    timeout: float | None = Field(default=None, gt=0, le=600)
    # How the KV moves (proxy/stream/move_kinds.py); None: the `move_kind` setting.
    kind: Literal["auto", "recompute", "handover", "precopy"] | None = None


def live_view(entry: LiveEntry) -> dict[str, Any]:
    """A live request as GET /admin/requests shows it: `movable` / `not_movable_reason` say
    whether it can move if its backend fails, `planned_movable` / `planned_not_movable_reason`
    whether migrate and evacuate can move it now (a seeded request moves on failure only)."""
    planned = entry.movable_reason(planned=True)
    return {
        **entry.view(),
        "planned_movable": planned == "",
        "planned_not_movable_reason": planned or None,
    }


# The migrate route's answer when the request did not move, as its OpenAPI entry says it.
MIGRATE_REFUSED: dict[int | str, dict[str, Any]] = {
    409: {
        "description": "The request did not move: its outcome and why",
        "content": {"application/json": {"schema": {"type": "object"}}},
    }
}


class RequestRoutes:
    """The handlers of /admin/requests/...; their names are the routes' OpenAPI names."""

    def __init__(self, core: ControlServices) -> None:
        self.core = core

    async def live_requests(self) -> list[dict[str, Any]]:
        return [live_view(r) for r in self.core.live]

    async def migrate(self, request_id: str, order: MoveOrderBody | None = None) -> JSONResponse:
        """Move a running request to another backend (`to`, else the policy's choice),
        continuing its stream from the last token its client received. The request is named
        by its x-request-id or by its upstream request id (unique; what the rescheduler
        uses)."""
        order = order or MoveOrderBody()
        to = backend_or_404(self.core.fleet, order.to) if order.to is not None else None
        entry = operations.find_live_request(self.core.live, request_id)
        if entry is None:
            raise HTTPException(status_code=404, detail=f"no live request {request_id!r}")
        result = await operations.move_one(
            self.core, entry, to, order.reason, order.timeout, order.kind, source=order.source
        )
        code = 200 if result["outcome"] in ("ok", "pending") else 409
        return JSONResponse(status_code=code, content=result)
