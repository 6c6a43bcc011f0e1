"""How evenly a router spread the requests over the engines, from the engines' own /metrics
(the requests each finished during the run, vllm:request_success_total): the counts per
engine and the busiest engine's count over the mean. Read from the engines, not the router,
so every router is judged alike, whether or not it says where it sent a request."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def engine_requests(summary: Mapping[str, Any]) -> dict[str, float]:
    """Requests finished per engine during the run (a bench run's summary with
    --backend-metrics); an engine whose /metrics did not answer is left out."""
    backends = (summary.get("backend_metrics") or {}).get("backends") or {}
    return {
        engine: float(row["delta"]["requests"])
        for engine, row in sorted(backends.items())
        if (row.get("delta") or {}).get("requests") is not None
    }


def max_over_mean(counts: Sequence[float]) -> float | None:
    """1.0 when every engine served as many; n engines when one served them all."""
    if not counts or sum(counts) <= 0:
        return None
    return max(counts) / (sum(counts) / len(counts))


def spread(summary: Mapping[str, Any]) -> dict[str, Any]:
    per_engine = engine_requests(summary)
    return {"per_engine": per_engine, "max_over_mean": max_over_mean(list(per_engine.values()))}


def counts_text(per_engine: Mapping[str, float]) -> str:
    """The counts, busiest first: `31/27/22/20` (engines differ run to run, fresh ports)."""
    if not per_engine:
        return "-"
    return "/".join(f"{n:.0f}" for n in sorted(per_engine.values(), reverse=True))
