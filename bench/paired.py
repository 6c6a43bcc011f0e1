"""Paired A/B comparison over repeated runs on identical input.

Run k of A and run k of B form a pair; the mean of the paired differences B - A gets a
two-sided confidence interval from Student's t with n - 1 degrees of freedom (scipy's
quantile). When the interval contains 0 the runs do not show a difference, and that is what
is reported: small single-run deltas are noise until shown otherwise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.summary import dig

NO_DIFFERENCE = "no difference"


@dataclass(frozen=True, slots=True)
class PairedDiff:
    n: int
    mean_a: float
    mean_b: float
    mean_diff: float  # mean of (b_k - a_k)
    ci_low: float | None
    ci_high: float | None
    confidence: float
    verdict: str  # "no difference" | "B higher" | "B lower" | "too few runs"

    @property
    def relative(self) -> float | None:
        return self.mean_diff / self.mean_a if self.mean_a else None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "relative": self.relative}


def t_quantile(confidence: float, dof: int) -> float:
    # scipy is the bench extra's; imported here so single-target runs do without it.
    from scipy import stats  # type: ignore[import-untyped]

    return float(stats.t.ppf(0.5 + confidence / 2.0, dof))


def paired_difference(
    a: Sequence[float], b: Sequence[float], confidence: float = 0.95
) -> PairedDiff:
    if len(a) != len(b):
        raise ValueError("paired samples must have equal length")
    if not a:
        raise ValueError("no pairs")
    diffs = [y - x for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    mean = statistics.fmean(diffs)
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    if n < 2:
        return PairedDiff(n, mean_a, mean_b, mean, None, None, confidence, "too few runs")
    half = t_quantile(confidence, n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    low, high = mean - half, mean + half
    verdict = NO_DIFFERENCE if low <= 0.0 <= high else "B higher" if mean > 0 else "B lower"
    return PairedDiff(n, mean_a, mean_b, mean, low, high, confidence, verdict)


# (label, path into a run summary, lower is better)
COMPARED_METRICS: tuple[tuple[str, tuple[str, ...], bool], ...] = (
    ("TTFT p50 ms", ("ttft_ms", "p50"), True),
    ("TTFT p90 ms", ("ttft_ms", "p90"), True),
    ("TTFT p99 ms", ("ttft_ms", "p99"), True),
    ("TPOT p50 ms", ("tpot_ms", "p50"), True),
    ("TPOT p90 ms", ("tpot_ms", "p90"), True),
    ("E2E p50 ms", ("e2e_ms", "p50"), True),
    ("E2E p90 ms", ("e2e_ms", "p90"), True),
    ("E2E p99 ms", ("e2e_ms", "p99"), True),
    ("throughput req/s", ("throughput", "requests_per_s"), False),
    ("output tok/s", ("throughput", "output_tokens_per_s"), False),
    ("goodput req/s", ("slo", "goodput_rps"), False),
    ("SLO attainment", ("slo", "attainment"), False),
    ("errors", ("errors",), True),
)


def metric_value(summary: Mapping[str, Any], path: Sequence[str]) -> float | None:
    node = dig(summary, *path)
    return float(node) if isinstance(node, int | float) else None


def compare_settings(
    runs_a: Sequence[Mapping[str, Any]],
    runs_b: Sequence[Mapping[str, Any]],
    confidence: float = 0.95,
) -> list[dict[str, Any]]:
    """One row per compared metric over the paired runs (pairs missing a value are dropped)."""
    rows = []
    for label, path, lower_better in COMPARED_METRICS:
        pairs = [
            (va, vb)
            for ra, rb in zip(runs_a, runs_b, strict=False)
            if (va := metric_value(ra, path)) is not None
            and (vb := metric_value(rb, path)) is not None
        ]
        if not pairs:
            continue
        d = paired_difference([p[0] for p in pairs], [p[1] for p in pairs], confidence)
        rows.append({"metric": label, "lower_is_better": lower_better, **d.to_json()})
    return rows
