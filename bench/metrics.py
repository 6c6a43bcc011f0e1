"""Per-request metric arithmetic (as `vllm bench serve` defines them).

TTFT: send to the first chunk with non-empty content. ITL: every gap between content chunks.
E2E: send to end of stream. TPOT: (E2E - TTFT) / (output tokens - 1), undefined for fewer than
two output tokens.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Derived:
    ttft: float | None
    itls: list[float]
    tpot: float | None
    e2e: float


def derive(
    sent: float, content_times: Sequence[float], end: float, output_tokens: int | None
) -> Derived:
    """Metrics of one request from its raw clock readings (same clock for all)."""
    e2e = end - sent
    if not content_times:
        return Derived(ttft=None, itls=[], tpot=None, e2e=e2e)
    ttft = content_times[0] - sent
    itls = [b - a for a, b in itertools.pairwise(content_times)]
    n_out = output_tokens if output_tokens is not None else len(content_times)
    tpot = (e2e - ttft) / (n_out - 1) if n_out > 1 else None
    return Derived(ttft=ttft, itls=itls, tpot=tpot, e2e=e2e)


PERCENTILES = (50, 90, 99)


def percentile(ordered: Sequence[float], p: float) -> float:
    """The p-th percentile of sorted values by linear interpolation between the closest ranks
    (numpy's default method, as `vllm bench serve` reports), in plain Python so that a run
    needs no numpy."""
    rank = (len(ordered) - 1) * p / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def distribution(values: Sequence[float]) -> dict[str, float | None]:
    """mean, p50, p90, p99 (linear interpolation, as vllm bench) and the count."""
    if not values:
        return {"n": 0, "mean": None, **{f"p{p}": None for p in PERCENTILES}}
    ordered = sorted(float(v) for v in values)
    out: dict[str, float | None] = {
        "n": float(len(ordered)),
        "mean": math.fsum(ordered) / len(ordered),
    }
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(ordered, p)
    return out
