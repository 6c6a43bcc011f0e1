import math

import pytest

from bench.paired import (
    NO_DIFFERENCE,
    compare_settings,
    metric_value,
    paired_difference,
    t_quantile,
)


def test_t_quantiles_match_the_table() -> None:
    assert t_quantile(0.95, 1) == pytest.approx(12.706, abs=1e-3)
    assert t_quantile(0.95, 4) == pytest.approx(2.776, abs=1e-3)
    assert t_quantile(0.95, 9) == pytest.approx(2.262, abs=1e-3)


def test_interval_by_hand() -> None:
    # Differences 1, 2, 3: mean 2, sd 1, half-width t(0.975, 2) / sqrt(3) = 4.303 / 1.732.
    d = paired_difference([10.0, 10.0, 10.0], [11.0, 12.0, 13.0])
    half = 4.302653 / math.sqrt(3)
    assert d.mean_diff == pytest.approx(2.0)
    assert d.ci_low == pytest.approx(2.0 - half, abs=1e-4)
    assert d.ci_high == pytest.approx(2.0 + half, abs=1e-4)
    assert d.verdict == NO_DIFFERENCE  # the interval [-0.48, 4.48] contains 0
    assert d.relative == pytest.approx(0.2)


def test_consistent_shift_is_a_difference() -> None:
    a = [100.0, 120.0, 90.0, 110.0]
    d = paired_difference(a, [x - 10.0 + e for x, e in zip(a, (0.5, -0.5, 0.2, -0.2), strict=True)])
    assert d.verdict == "B lower"
    assert d.ci_high is not None and d.ci_high < 0
    up = paired_difference(a, [x + 5.0 + e for x, e in zip(a, (0.5, -0.5, 0.2, -0.2), strict=True)])
    assert up.verdict == "B higher"


def test_pairing_removes_run_to_run_drift() -> None:
    # Runs vary a lot, but B is always 1 below its A: paired, that is a clear difference.
    a = [100.0, 200.0, 150.0]
    d = paired_difference(a, [x - 1.0 for x in a])
    assert d.verdict == "B lower" and d.ci_low == d.ci_high == pytest.approx(-1.0)


def test_too_few_runs_and_bad_input() -> None:
    assert paired_difference([1.0], [2.0]).verdict == "too few runs"
    with pytest.raises(ValueError):
        paired_difference([1.0, 2.0], [1.0])
    with pytest.raises(ValueError):
        paired_difference([], [])


def test_compare_settings_reads_summaries() -> None:
    def summary(ttft_p50: float, rps: float | None) -> dict[str, object]:
        return {"ttft_ms": {"p50": ttft_p50}, "throughput": {"requests_per_s": rps}, "errors": 0}

    a = [summary(10.0, 5.0), summary(12.0, 5.5), summary(11.0, None)]
    b = [summary(8.0, 5.0), summary(9.0, 5.4), summary(8.5, 6.0)]
    rows = {r["metric"]: r for r in compare_settings(a, b)}
    assert rows["TTFT p50 ms"]["n"] == 3
    assert rows["TTFT p50 ms"]["mean_diff"] == pytest.approx(-2.5)
    assert rows["throughput req/s"]["n"] == 2  # the pair with a missing value is dropped
    assert "TPOT p50 ms" not in rows
    assert metric_value({"a": {"b": 3}}, ("a", "b")) == 3.0
    assert metric_value({"a": {}}, ("a", "b")) is None
