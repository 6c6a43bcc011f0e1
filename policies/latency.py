"""Predicted TTFT and TPOT of one request on each engine, from the engine's own latency
histograms and its queue; and how predictions against an SLO become scores and tiers.

Pure functions of scraped metrics and numbers: no I/O, no clock, no backend objects.

The model, per engine (a window is the interval between its last two scrapes when some
request or token was observed in it, else everything since the engine started):
- prefill rate R = computed prompt tokens / seconds in the prefill phase, summed over the
  requests that finished in the window (`vllm:request_prefill_kv_computed_tokens` over
  `vllm:request_prefill_time_seconds`; an engine without the first: prompt tokens over
  time to first token, which counts queueing too, so it errs slow). A ratio of sums, so long
  prompts weigh in proportion to their tokens; under concurrency prefills share steps, so R
  is a per-request rate and errs slow too.
- queued tokens Q = the larger of the proxy's pending prefill tokens there and the scraped
  waiting requests x the window's mean computed prompt tokens per request;
- TTFT = (Q + U) / R, with U this request's uncached prompt tokens there (the prompt where
  no prefix index knows better);
- ITL = the window's mean inter-token latency (`vllm:inter_token_latency_seconds`), observed
  at a mean decode batch B_obs = generation tokens / engine steps in the same window (>= 1);
- TPOT = ITL x ((1 - s) + s x B / B_obs), with B = running + waiting + 1 (this request) and
  s = `itl_batch_share`, the part of a step's time that grows with the batch (1: linear in
  the batch; decode on a GPU is mostly a fixed cost per step, so the default is 0.25).
An engine with no observation of R, ITL (with its B_obs) or tokens per request yet takes the
median of the candidates that have one, else the configured default (R, ITL at batch 1) or
this request's prompt tokens (tokens per request): a fresh engine is assumed to be like its
peers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median

from fleet.types import EngineMetrics

TTFT_HEADER = "x-slo-ttft-ms"
TPOT_HEADER = "x-slo-tpot-ms"


@dataclass(frozen=True, slots=True)
class Slo:
    """A request's latency objectives in seconds; None: not given."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def __bool__(self) -> bool:
        return self.ttft_s is not None or self.tpot_s is not None


def _ms(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        ms = float(value)
    except ValueError:
        return None
    return ms / 1000.0 if math.isfinite(ms) and ms > 0 else None


def parse_slo(headers: Mapping[str, str]) -> Slo:
    """`x-slo-ttft-ms` and `x-slo-tpot-ms`; a missing, unparsable or non-positive value is no
    objective."""
    return Slo(_ms(headers.get(TTFT_HEADER)), _ms(headers.get(TPOT_HEADER)))


@dataclass(frozen=True, slots=True)
class Rates:
    """What one engine's scrapes say about its speed; None: not observed yet."""

    prefill_tokens_per_s: float | None
    itl_s: float | None
    itl_batch: float  # mean decode batch while `itl_s` was observed, >= 1
    tokens_per_request: float | None  # mean computed prompt tokens per request


@dataclass(frozen=True, slots=True)
class Prediction:
    ttft_s: float
    tpot_s: float


def _ratio(
    num: float, den: float, n: float, prev_num: float, prev_den: float, prev_n: float
) -> float | None:
    """num / den over the recent window when it has samples, else over the engine's life."""
    if n > prev_n and num > prev_num and den > prev_den:
        return (num - prev_num) / (den - prev_den)
    if n > 0 and num > 0 and den > 0:
        return num / den
    return None


def observed_rates(cur: EngineMetrics, prev: EngineMetrics | None) -> Rates:
    p = prev if prev is not None else EngineMetrics()
    if cur.prefill_computed_count > 0:
        prefill = _ratio(
            cur.prefill_computed_sum,
            cur.prefill_time_sum,
            cur.prefill_time_count,
            p.prefill_computed_sum,
            p.prefill_time_sum,
            p.prefill_time_count,
        )
        per_request = _ratio(
            cur.prefill_computed_sum,
            cur.prefill_computed_count,
            cur.prefill_computed_count,
            p.prefill_computed_sum,
            p.prefill_computed_count,
            p.prefill_computed_count,
        )
    else:
        prefill = _ratio(
            cur.prompt_len_sum,
            cur.ttft_sum,
            cur.ttft_count,
            p.prompt_len_sum,
            p.ttft_sum,
            p.ttft_count,
        )
        per_request = _ratio(
            cur.prompt_len_sum,
            cur.prompt_len_count,
            cur.prompt_len_count,
            p.prompt_len_sum,
            p.prompt_len_count,
            p.prompt_len_count,
        )
    if cur.itl_count > p.itl_count and cur.itl_sum > p.itl_sum:
        itl: float | None = (cur.itl_sum - p.itl_sum) / (cur.itl_count - p.itl_count)
        steps, tokens = cur.steps - p.steps, cur.generation_tokens - p.generation_tokens
    elif cur.itl_count > 0 and cur.itl_sum > 0:
        itl = cur.itl_sum / cur.itl_count
        steps, tokens = cur.steps, cur.generation_tokens
    else:
        itl, steps, tokens = None, 0.0, 0.0
    batch = tokens / steps if steps > 0 and tokens > 0 else 1.0
    return Rates(prefill, itl, max(1.0, batch), per_request)


@dataclass(frozen=True, slots=True)
class Speed:
    """Rates with every gap filled: what a prediction needs."""

    prefill_tokens_per_s: float
    itl_s: float
    itl_batch: float
    tokens_per_request: float


def _median_or(values: Sequence[float | None], default: float) -> float:
    known = [v for v in values if v is not None]
    return median(known) if known else default


def fill_unobserved(
    rates: Sequence[Rates], prefill_tokens_per_s: float, itl_s: float, tokens_per_request: float
) -> list[Speed]:
    """Every unobserved rate replaced by the median of the observed ones, else the default."""
    prefill = _median_or([r.prefill_tokens_per_s for r in rates], prefill_tokens_per_s)
    itl = _median_or([r.itl_s for r in rates], itl_s)
    # a borrowed ITL comes with the batch it was observed at
    itl_batch = _median_or([r.itl_batch for r in rates if r.itl_s is not None], 1.0)
    per_request = _median_or([r.tokens_per_request for r in rates], tokens_per_request)
    return [
        Speed(
            prefill if r.prefill_tokens_per_s is None else r.prefill_tokens_per_s,
            itl if r.itl_s is None else r.itl_s,
            itl_batch if r.itl_s is None else r.itl_batch,
            per_request if r.tokens_per_request is None else r.tokens_per_request,
        )
        for r in rates
    ]


def predict(
    speed: Speed,
    pending_prefill_tokens: float,
    waiting: float,
    batch: float,
    uncached_tokens: float,
    itl_batch_share: float,
) -> Prediction:
    """TTFT and TPOT of a request with `uncached_tokens` to prefill, on an engine of this speed
    with `waiting` requests queued, `pending_prefill_tokens` known to the proxy and `batch`
    requests running or waiting."""
    queued = max(pending_prefill_tokens, waiting * speed.tokens_per_request)
    ttft = (queued + uncached_tokens) / speed.prefill_tokens_per_s
    growth = (batch + 1.0) / speed.itl_batch
    tpot = speed.itl_s * ((1.0 - itl_batch_share) + itl_batch_share * growth)
    return Prediction(ttft, tpot)


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """The predictor's settings; also the key its predictions are cached under."""

    default_prefill_tokens_per_s: float = 8000.0
    default_itl_s: float = 0.020
    itl_batch_share: float = 0.25


@dataclass(slots=True)
class LatencyCycle:
    """One scheduling cycle's SLO, and its predictions per model settings and backend id."""

    slo: Slo
    predictions: dict[LatencyModel, dict[str, Prediction]] = field(default_factory=dict)
