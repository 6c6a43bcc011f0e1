from __future__ import annotations

import pytest

from rescheduler.tpot import TpotModel, fit_tpot_model, predict_tpot
from rescheduler.view import InstanceView
from tests.unit.rescheduler.builders import inst


def measured(id: str, batch: float, itl: float | None) -> InstanceView:
    return inst(id, num_running=batch, recent_itl_s=itl)


@pytest.mark.parametrize(
    ("points", "expected"),
    [
        # exactly on the line 0.010 + 0.002 * batch
        ([(5, 0.020), (10, 0.030), (20, 0.050)], TpotModel(0.010, 0.002)),
        # one batch size: proportional, the mean per-request time (0.004 and 0.006)
        ([(10, 0.040), (10, 0.060)], TpotModel(0.0, 0.005)),
        # falling with the batch: the mean as a constant
        ([(2, 0.040), (10, 0.020)], TpotModel(0.030, 0.0)),
        # line crossing zero below batch 0: through the origin, sum(xy) / sum(x^2)
        ([(10, 0.010), (20, 0.050)], TpotModel(0.0, (0.1 + 1.0) / 500)),
    ],
)
def test_fit(points: list[tuple[float, float]], expected: TpotModel) -> None:
    model = fit_tpot_model(measured(f"i{k}", b, t) for k, (b, t) in enumerate(points))
    assert model is not None
    assert model.intercept == pytest.approx(expected.intercept)
    assert model.per_request == pytest.approx(expected.per_request)


def test_fit_ignores_instances_without_an_itl_or_a_batch() -> None:
    model = fit_tpot_model(
        [
            measured("a", 5, 0.020),
            measured("b", 10, 0.030),
            measured("idle", 0, 0.500),  # an ITL from requests that have since finished
            measured("silent", 40, None),
        ]
    )
    assert model is not None
    assert model.intercept == pytest.approx(0.010)
    assert model.per_request == pytest.approx(0.002)


def test_no_data_no_model() -> None:
    assert fit_tpot_model([measured("a", 0, None), measured("b", 3, None)]) is None
    assert predict_tpot(measured("a", 3, 0.02), None) is None


MODEL = TpotModel(0.010, 0.002)


@pytest.mark.parametrize(
    ("instance", "extra", "expected"),
    [
        # own ITL at its batch
        (measured("a", 10, 0.045), 0, 0.045),
        # own ITL scaled by the model: 0.045 * (0.010 + 0.030) / (0.010 + 0.020)
        (measured("a", 10, 0.045), 5, 0.060),
        # no own ITL: the fleet model at the batch
        (measured("a", 10, None), 0, 0.030),
        (measured("a", 10, None), 5, 0.040),
        # an ITL without a batch says nothing about the current batch
        (measured("a", 0, 0.5), 3, 0.016),
    ],
)
def test_predict(instance: InstanceView, extra: float, expected: float) -> None:
    assert predict_tpot(instance, MODEL, extra) == pytest.approx(expected)


def test_predict_with_a_zero_model_falls_back_to_the_model() -> None:
    assert predict_tpot(measured("a", 4, 0.02), TpotModel(0.0, 0.0), 2) == 0.0
