"""Latency scorer: predicted TTFT and TPOT against the request's SLO (policies/latency.py for
the prediction, policies/headroom.py for the scores).

With `x-slo-ttft-ms` and/or `x-slo-tpot-ms`: the weighted headroom over the objectives the
request carries; without: inverse min-max of the predicted latencies.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field, model_validator

from fleet.types import Backend
from policies.framework import PluginBase, SchedulingRequest
from policies.headroom import Strategy, relative_scores, slo_scores
from policies.predicted import LatencyModelParams, predictions, request_slo


class LatencyScorerParams(LatencyModelParams):
    ttft_weight: float = Field(1.0, ge=0.0)
    tpot_weight: float = Field(1.0, ge=0.0)
    headroom: Strategy = "most"

    @model_validator(mode="after")
    def _some_weight(self) -> LatencyScorerParams:
        if self.ttft_weight + self.tpot_weight <= 0.0:
            raise ValueError("ttft_weight + tpot_weight must be positive")
        return self


class LatencyScorer(PluginBase):
    type = "latency-scorer"

    def __init__(self, params: LatencyScorerParams, name: str = "") -> None:
        super().__init__(name)
        self.params = params
        self.model = params.latency_model()

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        p = self.params
        preds = predictions(req, candidates, self.model)
        slo = request_slo(req)
        if slo:
            scores = slo_scores(preds, slo, p.ttft_weight, p.tpot_weight, p.headroom)
        else:
            scores = relative_scores(preds, p.ttft_weight, p.tpot_weight)
        if req.explain:
            for b, pred in zip(candidates, preds, strict=True):
                req.note(b.id, f"{self.name}.ttft_ms", pred.ttft_s * 1000.0)
                req.note(b.id, f"{self.name}.tpot_ms", pred.tpot_s * 1000.0)
        return scores
