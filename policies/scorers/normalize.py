"""Turning raw loads into [0, 1] scores."""

from __future__ import annotations

from collections.abc import Sequence


def inverse_min_max(values: Sequence[float]) -> list[float]:
    """Least loaded -> 1.0, most loaded -> 0.0, linear between; all equal -> all 1.0."""
    lo = min(values)
    hi = max(values)
    if hi <= lo:
        return [1.0] * len(values)
    span = hi - lo
    return [(hi - v) / span for v in values]
