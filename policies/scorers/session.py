"""Session affinity: the backend that served a session's last request scores 1, others 0."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.base import Decision
from policies.plugin import SchedulingRequest
from policies.plugin_base import PluginBase
from policies.sessions import AffinityTable


class SessionAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_sessions: int = Field(100_000, ge=1)


class SessionAffinityScorer(PluginBase):
    """The session is the `x-session-id` header or the body's `user` (RequestContext.session_id)."""

    type = "session-affinity-scorer"

    def __init__(self, params: SessionAffinityParams, name: str = "") -> None:
        super().__init__(name)
        self.sessions = AffinityTable(params.max_sessions)

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        sid = req.ctx.session_id
        owner = None if sid is None else self.sessions.get(sid)
        if owner is None:
            return [0.0] * len(candidates)
        return [1.0 if b.spec.id == owner else 0.0 for b in candidates]

    def on_picked(self, req: SchedulingRequest, decision: Decision) -> None:
        if req.ctx.session_id is not None:
            self.sessions.set(req.ctx.session_id, decision.target.id)

    def on_backend_removed(self, backend_id: str) -> None:
        self.sessions.forget_backend(backend_id)

    def stats(self) -> dict[str, int]:
        return {"sessions": len(self.sessions)}
