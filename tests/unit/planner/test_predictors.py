"""The load predictors: constant, moving average, and the Kalman (local linear trend) model."""

from __future__ import annotations

import math

import pytest

from planner.config import PredictorKind
from planner.predictors import MIN_OBSERVATIONS, KalmanPredictor, make_predictor
from planner.sla import ConstantPredictor, MovingAveragePredictor


def fed(predictor: KalmanPredictor, values: list[float]) -> KalmanPredictor:
    for v in values:
        predictor.observe(v)
    return predictor


def test_kalman_extrapolates_a_ramp_one_step() -> None:
    ramp = [float(x) for x in range(1, 11)]  # 1..10: the next is 11
    forecast = fed(KalmanPredictor(10), ramp).predict()
    assert forecast is not None
    assert forecast == pytest.approx(11.0, abs=0.1)
    # A moving average of the same window trails it: 5.5.
    average = MovingAveragePredictor(10)
    for v in ramp:
        average.observe(v)
    assert average.predict() == 5.5


def test_kalman_on_a_constant_series_is_that_constant() -> None:
    assert fed(KalmanPredictor(10), [4.0] * 10).predict() == 4.0


def test_kalman_falls_back_to_the_last_value_while_it_has_few_points() -> None:
    k = KalmanPredictor(10)
    assert k.predict() is None
    fed(k, [1.0, 5.0, 2.0, 7.0])  # under MIN_OBSERVATIONS (5)
    assert MIN_OBSERVATIONS == 5
    assert k.predict() == 7.0


def test_kalman_fits_only_its_window() -> None:
    # 100 flat points then a ramp: a window of 6 sees only the ramp 1..6 and continues it.
    forecast = fed(KalmanPredictor(6), [50.0] * 100 + [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).predict()
    assert forecast == pytest.approx(7.0, abs=0.1)


def test_kalman_never_forecasts_a_negative_or_non_finite_value() -> None:
    falling = fed(KalmanPredictor(5), [40.0, 30.0, 20.0, 10.0, 0.0]).predict()
    assert falling == 0.0  # the line says -10; a rate is not negative
    noisy = fed(KalmanPredictor(8), [0.0, 1e300, 0.0, 1e300, 0.0, 1e300, 0.0, 1e300]).predict()
    assert noisy is not None and math.isfinite(noisy) and noisy >= 0


def test_kalman_window_must_hold_enough_points() -> None:
    with pytest.raises(ValueError, match="kalman window"):
        KalmanPredictor(3)


def test_make_predictor_by_kind() -> None:
    assert isinstance(make_predictor(PredictorKind.CONSTANT, 10), ConstantPredictor)
    average = make_predictor(PredictorKind.MOVING_AVERAGE, 2)
    for v in (1.0, 2.0, 6.0):
        average.observe(v)
    assert average.predict() == 4.0  # (2 + 6) / 2: the window is 2
    small = make_predictor(PredictorKind.KALMAN, 2)  # raised to the model's minimum
    assert isinstance(small, KalmanPredictor)
