"""Session affinity: the backend that served a session's last request scores 1, others 0."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.plugin import SchedulingRequest
from policies.sessions import SessionOwnerPlugin


class SessionAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_sessions: int = Field(100_000, ge=1)


class SessionAffinityScorer(SessionOwnerPlugin):
    """The session is RequestContext.session_id: the `session_header` (`x-session-id`), else
    the body's `session_body_field` (`user`)."""

    type = "session-affinity-scorer"

    def __init__(self, params: SessionAffinityParams, name: str = "") -> None:
        super().__init__(params.max_sessions, name)

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        owner = self.owner(req)
        if owner is None:
            return [0.0] * len(candidates)
        return [1.0 if b.spec.id == owner else 0.0 for b in candidates]

    def stats(self) -> dict[str, int]:
        return {"sessions": len(self.sessions)}
