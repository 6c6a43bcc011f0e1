"""Session affinity: the session's rendezvous home among the candidates scores 1, others 0.

The home is a function of the session id and the candidates' ids (policies/rendezvous.py), so
every worker and replica scores the same backend with no table. Where the picker sends a
session elsewhere (its load scores won), the next request is still scored towards home: the
cache that turn left behind is the prefix-cache scorer's to weigh.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict

from fleet.types import Backend
from policies.framework import PluginBase, SchedulingRequest
from policies.rendezvous import home


class SessionAffinityParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SessionAffinityScorer(PluginBase):
    """The session is RequestContext.session_id: the `session_header` (`x-session-id`), else
    the body's `session_body_field` (`user`)."""

    type = "session-affinity-scorer"

    def __init__(self, params: SessionAffinityParams, name: str = "") -> None:
        super().__init__(name)

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        sid = req.ctx.session_id
        if sid is None:
            return [0.0] * len(candidates)
        target = home(sid, candidates)
        return [1.0 if b is target else 0.0 for b in candidates]
