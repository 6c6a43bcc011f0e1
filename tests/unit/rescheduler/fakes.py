"""A live request as the rescheduler reads it, without a proxy around it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from fleet.live import MoveResult, NotMovable
from fleet.types import Backend


@dataclass(eq=False)
class FakeEntry:
    request_id: str
    backend_id: str
    upstream_request_id: str = ""
    arrived_at: float = 0.0
    running: bool = True
    charged_prompt_tokens: int = 10
    tokens_generated: int = 5
    not_movable: str = ""
    move_delay: float = 0.0
    result: str = "ok"
    moves: list[tuple[str | None, str]] = field(default_factory=list)

    def movable_reason(self, planned: bool) -> str:
        return self.not_movable

    def view(self) -> dict[str, Any]:
        return {"request_id": self.request_id}

    def backend_down(self, why: str) -> None:
        pass

    def waiting_since(self) -> float | None:
        return None

    def last_read(self) -> float:
        return 0.0

    async def move(
        self, to: Backend | None = None, reason: str = "admin", *, kind: str | None = None
    ) -> MoveResult:
        if self.not_movable:
            raise NotMovable(self.not_movable)
        self.moves.append((to.id if to is not None else None, reason))
        await asyncio.sleep(self.move_delay)
        if self.result == "ok" and to is not None:
            self.backend_id = to.id
        return MoveResult(self.result, self.backend_id, to.id if to else None)
