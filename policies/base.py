"""The policy seam between the proxy and routing logic.

Routing code never does I/O and never awaits: `pick` is a pure function of the request
context, the candidate backends (read-only) and the clock reading passed in.
Optional capabilities are found by shape (`hasattr`), not by class:
- `on_finish(ctx, decision)`: a request routed by this policy has ended (success or not);
- `on_backend_removed(backend_id)`: a backend left the fleet;
- `bind_metrics(registry)`, `end_program(program_id) -> bool`, `stats() -> dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from fleet.types import Backend


@dataclass(slots=True)
class RequestContext:
    request_id: str
    endpoint: str  # "completions" or "chat/completions"
    model: str
    body: dict[str, Any]
    headers: Mapping[str, str]  # lower-case header names
    stream: bool
    # The text a prefix index hashes: the prompt, or the chat messages serialized in order.
    prompt_text: str
    # Estimated prompt tokens (a character estimate unless a tokenizer is configured).
    prompt_tokens: int
    session_id: str | None = None
    program_id: str | None = None
    debug: bool = False
    # The prompt came as token ids: prompt_tokens is exact, no counting needed.
    prompt_is_token_ids: bool = False
    # The prompt as the engine's token ids (chat template applied), when the policy routes by
    # the engines' own KV-cache events and they could be had (fleet/prompt_tokens.py).
    prompt_token_ids: Sequence[int] | None = None


@dataclass(slots=True)
class Decision:
    target: Backend
    prefill: Backend | None = None  # set when the request is disaggregated
    # Per candidate id, named scores: what a decision receipt shows.
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    reason: str = ""
    # Prompt tokens the target (and the prefill backend) are expected to compute, i.e. not
    # already in their prefix cache by the policy's prefix index. None: unknown, charge the
    # whole prompt. For the proxy's pending-prefill accounting, which LMetric reads: charging
    # a cached prompt in full makes the backend that holds it look busiest.
    prefill_tokens: int | None = None
    prefill_leg_tokens: int | None = None


class NoCandidate(Exception):
    """The policy found no backend it is willing to route to."""


class Policy(Protocol):
    name: str

    def pick(self, ctx: RequestContext, candidates: Sequence[Backend], now: float) -> Decision:
        """Choose among non-empty `candidates` (healthy, not draining, serving ctx.model)."""
        ...
