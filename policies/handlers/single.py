"""Runs one profile; its pick is the destination."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from fleet.types import Backend
from policies.framework import PluginBase, ProfileRunner, SchedulingRequest
from policies.policy import Decision, NoCandidate


class SingleProfileParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    profile: str | None = None  # None: the configuration's only profile


class SingleProfileHandler(PluginBase):
    type = "single-profile-handler"

    def __init__(self, profile: str | None = None, name: str = "") -> None:
        super().__init__(name)
        self.profile = profile

    def profile_names(self) -> list[str]:
        return [] if self.profile is None else [self.profile]

    def handle(
        self,
        req: SchedulingRequest,
        candidates: Sequence[Backend],
        profiles: Mapping[str, ProfileRunner],
    ) -> Decision:
        profile = profiles[self.profile] if self.profile else next(iter(profiles.values()))
        target = profile.run(req, candidates)
        if target is None:
            raise NoCandidate("; ".join(req.reasons) or f"profile {profile.name} chose nothing")
        return Decision(target=target)
