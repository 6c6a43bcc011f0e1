"""One line of metrics.jsonl: what happened to one request."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(slots=True)
class RequestRecord:
    setting: str  # the compared setting this run belongs to ("A", "lmetric", ...)
    repeat: int  # run index within the setting
    session_id: str
    turn: int
    call: int  # 0 for the main call of a turn, 1.. for parallel siblings
    scheduled_s: float  # when the replay wanted to send it, seconds from run start
    sent_s: float  # when it was sent, seconds from run start
    est_prompt_tokens: int  # characters / 4 of what was sent
    ttft_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None  # from usage
    completion_tokens: int | None = None  # from usage (falls back to content chunks)
    usage_reported: bool = False
    backend: str | None = None  # x-fleet-backend response header
    request_id: str | None = None  # x-request-id response header
    # fleet-proxy's routing receipt (x-fleet-decision: the backend, the reason, each
    # candidate's scores), when the proxy sent one
    decision: dict[str, Any] | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> RequestRecord:
        return cls(**obj)
