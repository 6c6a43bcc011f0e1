"""The routing benchmarks record the machine's load around every run and warn when the
1-minute load exceeds the core count."""

from __future__ import annotations

from tests.unit.bench.test_peer_readiness import load

machine_load = load("machine_load")


def test_a_load_above_the_cores_warns_and_one_at_or_below_does_not() -> None:
    assert machine_load.busy_warning([2.0, 9.0, 9.0], 2, "before x") is None
    warning = machine_load.busy_warning([2.5, 0.1, 0.1], 2, "before x")
    assert warning is not None and "1-minute load 2.5 exceeds the 2 cores before x" in warning


def test_a_runs_warnings_name_it_and_when() -> None:
    costs = {"load_before": [0.5, 1, 1], "load_after": [6.0, 3, 1], "cores": 4}
    (warning,) = machine_load.run_warnings(costs, "vllm-router:cache_aware run 1")
    assert "6.0 exceeds the 4 cores after vllm-router:cache_aware run 1" in warning
    assert machine_load.run_warnings({}, "old run") == []  # recorded before loads were


def test_the_load_now_is_three_averages() -> None:
    now = machine_load.load_now()
    assert len(now) == 3 and all(x >= 0 for x in now)
    assert machine_load.cores() >= 1
