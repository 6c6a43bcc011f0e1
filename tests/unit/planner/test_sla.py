"""The SLA arithmetic against hand-computed cases, and the predictors."""

from __future__ import annotations

import pytest

from planner.sla import (
    ConstantPredictor,
    DecodeGrid,
    MovingAveragePredictor,
    Predictor,
    PrefillCurve,
    ceil_count,
    correction,
    decode_replicas,
    interpolate,
    prefill_replicas,
)

PREFILL = PrefillCurve(((1000, 0.100), (3000, 0.250)))
# ITL at context 1000 and 3000; at 2000 it is the midpoint: (1, .011) (10, .014) (50, .025)
# (100, .050).
DECODE = DecodeGrid(
    (
        (1000, ((1, 0.010), (10, 0.012), (50, 0.020), (100, 0.040))),
        (3000, ((1, 0.012), (10, 0.016), (50, 0.030), (100, 0.060))),
    ),
    kv_tokens=200_000,
)


def test_interpolation_is_linear_and_extends_the_end_segments() -> None:
    assert PREFILL.ttft(2000) == pytest.approx(0.175)
    assert PREFILL.ttft(4000) == pytest.approx(0.325)
    assert PREFILL.ttft(500) == pytest.approx(0.0625)
    assert interpolate([(0, 7)], 99) == 7
    assert DECODE.itl(50, 2000) == pytest.approx(0.025)
    assert DECODE.itl(30, 1000) == pytest.approx(0.016)
    assert DECODE.max_in_flight(2000) == 100
    assert DecodeGrid(DECODE.curves).max_in_flight(2000) == 100  # the largest profiled
    with pytest.raises(ValueError):
        interpolate([], 1)


@pytest.mark.parametrize(
    ("rate", "isl", "corr", "target", "replicas", "meets"),
    [
        # s = 0.175 s a request; 20 req/s keep 3.5 engines busy.
        (20, 2000, 1.0, 0.2, 4, True),
        # Observed TTFT 1.2x the profile: s = 0.21; 4.2 engines, and over the target.
        (20, 2000, 1.2, 0.2, 5, False),
        # s = 0.1 exactly; 40 req/s need 4.0 engines, not 5.
        (40, 1000, 1.0, 0.2, 4, True),
        (0, 1000, 1.0, 0.2, 0, True),
    ],
)
def test_prefill_replicas(
    rate: float, isl: float, corr: float, target: float, replicas: int, meets: bool
) -> None:
    plan = prefill_replicas(rate, isl, PREFILL, ttft_target=target, ttft_correction=corr)
    assert plan.replicas == replicas
    assert plan.meets_target is meets
    assert plan.engine_throughput == pytest.approx(isl / (PREFILL.ttft(isl) * corr))


def test_decode_replicas_at_the_target() -> None:
    # L = 1500 + 1000/2 = 2000; ITL <= 25 ms up to n = 50: 50 / 0.025 = 2000 tokens/s.
    # 10 req/s * 1000 tokens = 10000 tokens/s -> 5 engines.
    plan = decode_replicas(10, 1500, 1000, DECODE, itl_target=0.025)
    assert (plan.in_flight, plan.replicas, plan.meets_target) == (50, 5, True)
    assert plan.itl == pytest.approx(0.025)
    assert plan.engine_throughput == pytest.approx(2000)


def test_decode_correction_tightens_the_target() -> None:
    # Observed ITL 1.25x the profile: the profile must meet 20 ms. On 10..50,
    # ITL = 0.014 + 0.000275 (n - 10) <= 0.020 -> n = 31, ITL 0.019775:
    # 31 / 0.019775 = 1567.6 tokens/s -> ceil(10000 / 1567.6) = ceil(6.38) = 7.
    plan = decode_replicas(10, 1500, 1000, DECODE, itl_target=0.025, itl_correction=1.25)
    assert plan.in_flight == 31
    assert plan.itl == pytest.approx(0.019775)
    assert plan.replicas == 7


def test_decode_in_flight_is_capped_by_the_kv_cache() -> None:
    # 60000 KV tokens hold 30 requests of 2000: ITL 0.0195, 1538.5 tokens/s -> 6.5 -> 7.
    small = DecodeGrid(DECODE.curves, kv_tokens=60_000)
    plan = decode_replicas(10, 1500, 1000, small, itl_target=0.025)
    assert (plan.in_flight, plan.replicas) == (30, 7)


def test_decode_target_out_of_reach_is_reported() -> None:
    # Even one request runs 11 ms > 5 ms: n* = 1, 1/0.011 tokens/s -> 10000 * 0.011 = 110.
    plan = decode_replicas(10, 1500, 1000, DECODE, itl_target=0.005)
    assert (plan.in_flight, plan.replicas, plan.meets_target) == (1, 110, False)


def test_corrections_and_rounding() -> None:
    assert correction(0.3, 0.2) == pytest.approx(1.5)
    assert correction(None, 0.2) == 1.0
    assert correction(0.0, 0.2) == 1.0
    assert ceil_count(5.000000000001) == 5
    assert ceil_count(5.001) == 6
    assert ceil_count(-1.0) == 0


def test_constant_predictor_repeats_the_last_value() -> None:
    p: Predictor = ConstantPredictor()
    assert p.predict() is None
    for x in (3.0, 7.0):
        p.observe(x)
    assert p.predict() == 7.0


def test_moving_average_predictor_averages_its_window() -> None:
    p: Predictor = MovingAveragePredictor(window=3)
    assert p.predict() is None
    p.observe(2.0)
    assert p.predict() == 2.0
    for x in (4.0, 6.0, 8.0):
        p.observe(x)
    assert p.predict() == pytest.approx(6.0)  # (4 + 6 + 8) / 3; the 2 fell out
    with pytest.raises(ValueError, match="window"):
        MovingAveragePredictor(window=0)
