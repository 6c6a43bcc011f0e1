"""The request spread the routing benchmarks report: requests each engine finished during a
run, from the engines' /metrics deltas in a bench summary, and the busiest over the mean."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.bench.test_peer_readiness import load

request_spread = load("request_spread")


def summary(**served: float | None) -> dict[str, Any]:
    backends: dict[str, Any] = {}
    for engine, n in served.items():
        if n is None:
            backends[engine] = {"error": "metrics unavailable"}
        else:
            backends[engine] = {"delta": {"requests": n, "prefix_queries": 10.0}}
    return {"backend_metrics": {"backends": backends}}


def test_an_even_spread_is_one_and_a_single_engine_is_the_engine_count() -> None:
    even = request_spread.spread(summary(a=25, b=25, c=25, d=25))
    assert even["max_over_mean"] == 1.0
    one = request_spread.spread(summary(a=100, b=0, c=0, d=0))
    assert one["max_over_mean"] == 4.0


def test_the_counts_per_engine_come_from_the_metrics_deltas() -> None:
    got = request_spread.spread(summary(b=30, a=10, c=20, d=None))
    # An engine whose /metrics did not answer is left out rather than counted as idle.
    assert got["per_engine"] == {"a": 10.0, "b": 30.0, "c": 20.0}
    assert got["max_over_mean"] == pytest.approx(30 / 20)
    assert request_spread.counts_text(got["per_engine"]) == "30/20/10"


def test_a_run_without_engine_metrics_has_no_spread() -> None:
    for s in ({}, summary(), summary(a=0, b=0)):
        got = request_spread.spread(s)
        assert got["max_over_mean"] is None
    assert request_spread.counts_text({}) == "-"
