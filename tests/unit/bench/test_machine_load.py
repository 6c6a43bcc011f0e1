"""The routing benchmarks record the machine's load around every run and warn when the
1-minute load exceeds the core count."""

from __future__ import annotations

from tests.unit.bench.test_peer_readiness import load

machine_load = load("machine_load")


def test_a_load_above_the_cores_warns_and_one_at_or_below_does_not() -> None:
    assert machine_load.busy_warning([2.0, 9.0, 9.0], 2, "before x") is None
    warning = machine_load.busy_warning([2.5, 0.1, 0.1], 2, "before x")
    assert warning is not None and "1-minute load 2.5 exceeds the 2 cores before x" in warning


def test_one_warning_names_every_busy_run_and_when() -> None:
    runs = [
        ("vllm-router:cache_aware run 0", {"load_before": [0.5, 1, 1], "load_after": [1.0, 1, 1]}),
        ("vllm-router:cache_aware run 1", {"load_before": [0.5, 1, 1], "load_after": [6.0, 3, 1]}),
        ("fleet-proxy:lmetric run 0", {}),  # recorded before loads were: not judged
    ]
    for _, costs in runs[:2]:
        costs["cores"] = 4
    warning = machine_load.busy_summary(runs)
    assert warning is not None
    assert "around 1 of 3 runs: vllm-router:cache_aware run 1 (0.5 before, 6.0 after, 4 cores)" in (
        warning
    )
    assert "run 0" not in warning
    assert machine_load.busy_summary(runs[:1]) is None


def test_the_load_now_is_three_averages() -> None:
    now = machine_load.load_now()
    assert len(now) == 3 and all(x >= 0 for x in now)
    assert machine_load.cores() >= 1
