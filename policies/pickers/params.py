"""Parameter models shared by several pickers."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class NoParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SeedParams(BaseModel):
    """`seed` makes a random picker reproducible (tests, benchmarks); None seeds from the OS."""

    model_config = ConfigDict(extra="forbid")
    seed: int | None = None
