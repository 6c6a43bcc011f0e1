"""The replay unit: sessions of turns, the same shape for every workload.

A single Mooncake request is a one-turn session; a ShareGPT conversation or a synthetic chat
is a multi-turn session whose context grows turn by turn; an agent program is a session whose
turns may fan out into parallel calls over the shared context.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Turn:
    user: str  # the new user message of this turn
    max_tokens: int
    # The reference reply that enters the history in "dataset" history mode, so every run
    # sends byte-identical prompts whatever the server answered.
    reply: str = ""
    # Extra user messages sent concurrently with `user` over the same context (an agent's
    # parallel tool calls); they share the prefix but do not enter the history.
    parallel: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    turns: tuple[Turn, ...]
    arrival_s: float = 0.0  # offset from the start of the run (open loop)
    system: str = ""
    think_time_s: float = 0.0  # pause between a reply and the next turn
    headers: Mapping[str, str] = field(default_factory=lambda: _NO_HEADERS)

    @property
    def n_requests(self) -> int:
        return sum(1 + len(t.parallel) for t in self.turns)


@dataclass(frozen=True, slots=True)
class Workload:
    name: str
    sessions: tuple[Session, ...]
    params: Mapping[str, object] = field(default_factory=dict)  # what built it, for config.json

    @property
    def n_requests(self) -> int:
        return sum(s.n_requests for s in self.sessions)
