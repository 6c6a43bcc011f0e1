"""The policy seam between the proxy and routing logic.

Routing code never does I/O and never awaits: `pick` is a pure function of the request
context, the candidate backends (read-only) and the clock reading passed in. Every call the
proxy makes on its policy is declared on `Policy`; `Scheduler` (policies/scheduler.py) is the
implementation, and fans each call out to the plugins that declare the matching hook.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from fleet.types import Backend
from policies.metrics import PoolSource


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

    def on_backend_removed(self, backend_id: str) -> None:
        """A backend left the fleet: forget what is kept about it."""
        ...

    def bind_metrics(self, registry: CollectorRegistry, pools: PoolSource) -> None:
        """Register metrics on the proxy's registry; `pools` gives the fleet's pools at scrape
        time."""
        ...

    def stats(self) -> dict[str, Any]:
        """The policy's state for `GET /admin/policy`."""
        ...

    def keeps_programs(self) -> bool:
        """Whether the policy keeps agent programs, which `end_program` ends."""
        ...

    def end_program(self, program_id: str) -> bool:
        """Forget `program_id` (`DELETE /admin/programs/{id}`); False: no such program."""
        ...
