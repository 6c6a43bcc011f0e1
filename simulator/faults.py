"""Faults an engine can be told to show, by command-line flag or by its admin endpoint.

- `crash`: the engine stops answering: its port refuses connections and open ones are cut;
  `recover_after_s` (real seconds) brings it back as a freshly started engine.
- `hang`: connections are accepted but nothing is answered and running streams stall.
- `stall_generation`: generation requests (`/v1/completions`, `/v1/chat/completions`) are
  accepted and never answered and running requests stall, while `/health`, `/metrics`,
  `/v1/models` and the rest answer as usual (an engine core that stopped stepping behind a
  live API server).
- `metrics_unavailable`: `/metrics` answers 503 while everything else answers as usual (a
  broken metrics exporter: to a router the engine's numbers go stale while it still serves).
- `error_rate`: that fraction of completion requests is answered 500 (a seeded RNG, so a
  test sees the same sequence every run).
- `slowdown`: every engine step takes this many times longer.
- `die_after_tokens`: the engine crashes as soon as one request has produced that many tokens
  (a stream is cut mid-way, as when a vLLM process dies).
- `cut_stream_after_tokens`: each stream's connection is dropped after that many tokens while
  the engine stays up.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class FaultSettings:
    crash: bool = False
    recover_after_s: float | None = None
    hang: bool = False
    stall_generation: bool = False
    metrics_unavailable: bool = False
    error_rate: float = 0.0
    slowdown: float = 1.0
    die_after_tokens: int | None = None
    cut_stream_after_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = set(FaultSettings.__dataclass_fields__)


def parse_fault_update(body: Any) -> dict[str, Any]:
    """Validate a partial update from the admin endpoint; raise ValueError on bad input."""
    if not isinstance(body, dict):
        raise ValueError("expected a JSON object")
    unknown = set(body) - _FIELDS
    if unknown:
        raise ValueError(f"unknown fault fields: {sorted(unknown)}; known: {sorted(_FIELDS)}")
    out: dict[str, Any] = {}
    for key, value in body.items():
        if key in ("crash", "hang", "stall_generation", "metrics_unavailable"):
            if not isinstance(value, bool):
                raise ValueError(f"{key} must be true or false")
        elif key in ("die_after_tokens", "cut_stream_after_tokens"):
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"{key} must be a positive integer or null")
        elif key == "error_rate":
            if not isinstance(value, int | float) or not 0 <= value <= 1:
                raise ValueError("error_rate must be in [0, 1]")
        elif key == "slowdown":
            if not isinstance(value, int | float) or value <= 0:
                raise ValueError("slowdown must be positive")
        elif (
            key == "recover_after_s"
            and value is not None
            and (not isinstance(value, int | float) or value <= 0)
        ):
            raise ValueError("recover_after_s must be positive or null")
        out[key] = value
    return out


@dataclass(slots=True)
class FaultState:
    """The live fault switches of one engine, plus what waiting on them needs."""

    settings: FaultSettings = field(default_factory=FaultSettings)
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    # Set unless `hang`: every endpoint but the admin ones waits on it.
    unhung: asyncio.Event = field(default_factory=asyncio.Event)
    # Set unless `hang` or `stall_generation`: the step loop and new generation requests
    # wait on it.
    generating: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.unhung.set()
        self.generating.set()

    def apply(self, update: dict[str, Any]) -> None:
        for key, value in update.items():
            setattr(self.settings, key, value)
        s = self.settings
        for event, held in ((self.unhung, s.hang), (self.generating, s.hang or s.stall_generation)):
            if held:
                event.clear()
            else:
                event.set()

    def should_error(self) -> bool:
        rate = self.settings.error_rate
        return rate > 0 and self.rng.random() < rate

    def stream_limit(self) -> int | None:
        """Tokens after which a stream is cut, by either fault."""
        limits = [
            v
            for v in (self.settings.die_after_tokens, self.settings.cut_stream_after_tokens)
            if v is not None
        ]
        return min(limits) if limits else None
