"""Latency predictions against a request's SLO: scores in [0, 1] and tiers. Pure functions.

With an SLO, for each objective the request carries (TTFT, TPOT) the headroom is
h = (SLO - predicted) / SLO (1: predicted instant; 0: exactly at the SLO; < 0: missed), and
- `most` (default): c = clip(h, 0, 1), the more headroom the better;
- `least`: c = 1 - h when met (0 <= h), else 0: the engine that meets the objective with the
  least to spare wins, which packs requests on busy engines and keeps idle ones for later;
score = (w_ttft x c_ttft + w_tpot x c_tpot) / (w_ttft + w_tpot) over the objectives carried
(the plain mean where their weights sum to 0).

Without an SLO: c = inverse min-max of each predicted latency over the candidates (lowest 1,
highest 0), combined with the same weights over both.

Tier of a candidate = how many of the carried objectives it misses (predicted > SLO): 0 meets
them all, 1 meets one of two, 2 meets none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from policies.latency import Prediction, Slo
from policies.scorers.normalize import inverse_min_max

Strategy = Literal["most", "least"]


def headroom(slo_s: float, predicted_s: float) -> float:
    return (slo_s - predicted_s) / slo_s


def _component(h: float, strategy: Strategy) -> float:
    if h < 0.0:
        return 0.0
    c = 1.0 if h > 1.0 else h
    return c if strategy == "most" else 1.0 - c


def _combine(parts: Sequence[tuple[float, float]]) -> float:
    """Weighted mean of (weight, value) pairs; the plain mean when the weights sum to 0."""
    total = sum(w for w, _ in parts)
    if total <= 0.0:
        return sum(v for _, v in parts) / len(parts)
    return sum(w * v for w, v in parts) / total


def slo_scores(
    preds: Sequence[Prediction],
    slo: Slo,
    ttft_weight: float,
    tpot_weight: float,
    strategy: Strategy = "most",
) -> list[float]:
    out = []
    for p in preds:
        parts = []
        if slo.ttft_s is not None:
            parts.append((ttft_weight, _component(headroom(slo.ttft_s, p.ttft_s), strategy)))
        if slo.tpot_s is not None:
            parts.append((tpot_weight, _component(headroom(slo.tpot_s, p.tpot_s), strategy)))
        out.append(_combine(parts))
    return out


def relative_scores(
    preds: Sequence[Prediction], ttft_weight: float, tpot_weight: float
) -> list[float]:
    ttft = inverse_min_max([p.ttft_s for p in preds])
    tpot = inverse_min_max([p.tpot_s for p in preds])
    return [_combine([(ttft_weight, a), (tpot_weight, b)]) for a, b in zip(ttft, tpot, strict=True)]


def misses(pred: Prediction, slo: Slo) -> int:
    """How many of the request's objectives this prediction misses."""
    missed = 0
    if slo.ttft_s is not None and pred.ttft_s > slo.ttft_s:
        missed += 1
    if slo.tpot_s is not None and pred.tpot_s > slo.tpot_s:
        missed += 1
    return missed
