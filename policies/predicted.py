"""The latency predictions of one scheduling cycle, shared by the plugins that use them.

The first latency-aware plugin to ask parses the request's SLO headers and predicts every
candidate (policies/latency.py); the result stays on the SchedulingRequest, so the latency
scorer and the SLO tier filter of one configuration predict once, and a configuration without
them does none of this.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import SchedulingRequest
from policies.latency import (
    LatencyCycle,
    LatencyModel,
    Prediction,
    Rates,
    Slo,
    fill_unobserved,
    observed_rates,
    parse_slo,
    predict,
)
from policies.loads import batch_size, pending_prefill_tokens

_UNOBSERVED = Rates(None, None, 1.0, None)


class LatencyModelParams(BaseModel):
    """The predictor's params, common to the plugins that predict."""

    model_config = ConfigDict(extra="forbid")
    default_prefill_tokens_per_s: float = Field(8000.0, gt=0.0)
    default_itl_ms: float = Field(20.0, gt=0.0)
    itl_batch_share: float = Field(0.25, ge=0.0, le=1.0)

    def latency_model(self) -> LatencyModel:
        return LatencyModel(
            self.default_prefill_tokens_per_s, self.default_itl_ms / 1000.0, self.itl_batch_share
        )


def _cycle(req: SchedulingRequest) -> LatencyCycle:
    cycle = req.latency
    if cycle is None:
        cycle = req.latency = LatencyCycle(parse_slo(req.ctx.headers))
    return cycle


def request_slo(req: SchedulingRequest) -> Slo:
    return _cycle(req).slo


def _rates(b: Backend) -> Rates:
    snap = b.snapshot
    if snap is None:
        return _UNOBSERVED
    prev = b.previous_snapshot
    return observed_rates(snap.metrics, None if prev is None else prev.metrics)


def _predict_all(
    req: SchedulingRequest, candidates: Sequence[Backend], model: LatencyModel
) -> dict[str, Prediction]:
    speeds = fill_unobserved(
        [_rates(b) for b in candidates],
        model.default_prefill_tokens_per_s,
        model.default_itl_s,
        float(max(1, req.ctx.prompt_tokens)),
    )
    out: dict[str, Prediction] = {}
    for b, speed in zip(candidates, speeds, strict=True):
        snap = b.snapshot
        out[b.id] = predict(
            speed,
            pending_prefill_tokens(b),
            0.0 if snap is None else snap.metrics.waiting,
            batch_size(b),
            req.uncached_tokens(b.id),
            model.itl_batch_share,
        )
    return out


def predictions(
    req: SchedulingRequest, candidates: Sequence[Backend], model: LatencyModel
) -> list[Prediction]:
    """Each candidate's predicted TTFT and TPOT for this request, in order."""
    cycle = _cycle(req)
    known = cycle.predictions.get(model)
    if known is None:
        known = cycle.predictions[model] = _predict_all(req, candidates, model)
    elif any(b.id not in known for b in candidates):
        known.update(_predict_all(req, [b for b in candidates if b.id not in known], model))
    return [known[b.id] for b in candidates]
