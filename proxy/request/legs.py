"""One backend leg of a client request: the decision that chose its backend and its open
response. The leg's backend is chosen by proxy/request/choosing.py; its request is sent by the
session's `open_leg`, to the URL proxy/request/upstream_targets.py gives, its failures sorted
by proxy/request/upstream_failures.py; a P/D prefill leg or a move's KV legs run in
proxy/request/kv_legs.py.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from fleet.types import Backend
from policies.policy import Decision
from proxy.backends.upstream import UpstreamResponse

GENERATION = frozenset({"completions", "chat/completions"})


class Leg:
    """One backend's part of a client request: its decision and its open response."""

    __slots__ = (
        "backend",
        "closed",
        "decision",
        "kind",
        "opened_at",
        "prefill",
        "reason",
        "resp",
        "tokens_before",
    )

    def __init__(
        self,
        decision: Decision,
        prefill: Backend | None,
        resp: UpstreamResponse,
        reason: str,
        tokens_before: int,
        kind: str = "",
    ) -> None:
        self.decision = decision
        # How a continuation's KV reached it (proxy/stream/move_kinds.py); "" for a first leg.
        self.kind = kind
        self.backend = decision.target
        self.prefill = prefill
        self.resp = resp
        self.reason = reason  # why this leg exists: "first", "backend_failed", "admin"...
        self.tokens_before = tokens_before  # generated tokens the client had when it began
        self.opened_at = time.perf_counter()
        self.closed = False  # its response released and the policy told

    def receipt(self) -> dict[str, Any]:
        return {
            "backend": self.backend.id,
            "prefill": self.prefill.id if self.prefill is not None else None,
            "reason": self.reason,
            "tokens_before": self.tokens_before,
            "kind": self.kind or None,
        }


def receipt_header(decision: Decision) -> bytes:
    return orjson.dumps(
        {
            "backend": decision.target.id,
            "prefill": decision.prefill.id if decision.prefill else None,
            "reason": decision.reason,
            "scores": decision.scores,
        }
    )
