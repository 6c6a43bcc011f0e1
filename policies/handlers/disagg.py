"""Prefill/decode disaggregation (llm-d's disagg-profile-handler and a prefill/decode decider).

Runs the decode profile first: its pick is the destination. Then the decider:
- `always`: also run the prefill profile;
- `selective`: run it only when the prompt's uncached tokens on the chosen decode backend
  (prefix index) exceed `uncached_threshold_tokens`, and the prefill pool is not saturated
  (every prefill backend already has `saturation_pending_tokens` or more pending prefill
  tokens); a short or mostly cached prompt prefills on the decode backend, where it is cheap.
The result is Decision(target=decode, prefill=prefill or None); `reason` says why, and with
a receipt the decode backend's entry carries `pd.uncached_tokens` and `pd.disaggregated`.
If the prefill profile finds nothing, the request still goes to decode (local prefill).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend, Role
from policies.framework import PluginBase, ProfileRunner, RoutingServices, SchedulingRequest
from policies.loads import pending_prefill_tokens
from policies.policy import Decision, NoCandidate

Outcome = Literal["disaggregated", "short_prompt", "prefill_saturated", "no_prefill_backend"]


class DisaggParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    prefill_profile: str = "prefill"
    decode_profile: str = "decode"
    decider: Literal["always", "selective"] = "selective"
    uncached_threshold_tokens: int = Field(512, ge=0)
    saturation_pending_tokens: int = Field(32_768, ge=1)


class DisaggProfileHandler(PluginBase):
    type = "disagg-profile-handler"

    def __init__(self, params: DisaggParams, services: RoutingServices, name: str = "") -> None:
        super().__init__(name)
        if params.decider == "selective":
            services.use_prefix_index()
        self.params = params
        self.outcomes: dict[str, int] = {}
        self._counter: Counter | None = None

    def profile_names(self) -> list[str]:
        return [self.params.prefill_profile, self.params.decode_profile]

    def handle(
        self,
        req: SchedulingRequest,
        candidates: Sequence[Backend],
        profiles: Mapping[str, ProfileRunner],
    ) -> Decision:
        p = self.params
        decode = profiles[p.decode_profile].run(req, candidates)
        if decode is None:
            raise NoCandidate("; ".join(req.reasons) or "no decode backend")
        uncached = req.uncached_tokens(decode.id)
        outcome: Outcome
        prefill: Backend | None = None
        if p.decider == "selective" and uncached <= p.uncached_threshold_tokens:
            outcome = "short_prompt"
        elif p.decider == "selective" and self._saturated(candidates):
            outcome = "prefill_saturated"
        else:
            prefill = profiles[p.prefill_profile].run(req, candidates)
            outcome = "disaggregated" if prefill is not None else "no_prefill_backend"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if self._counter is not None:
            self._counter.labels(outcome).inc()
        if req.explain:
            req.note(decode.id, "pd.uncached_tokens", uncached)
            req.note(decode.id, "pd.disaggregated", 1.0 if prefill is not None else 0.0)
        return Decision(
            target=decode, prefill=prefill, reason=f"pd: {outcome} (uncached {uncached} tokens)"
        )

    def _saturated(self, candidates: Sequence[Backend]) -> bool:
        pool = [b for b in candidates if b.role is Role.PREFILL]
        limit = self.params.saturation_pending_tokens
        return bool(pool) and all(pending_prefill_tokens(b) >= limit for b in pool)

    def bind_metrics(self, registry: CollectorRegistry) -> None:
        self._counter = Counter(
            "fleet_pd_decisions",
            "Prefill/decode disaggregation decisions by outcome",
            ["outcome"],
            registry=registry,
        )

    def stats(self) -> dict[str, int]:
        return dict(self.outcomes)
