"""The SLA mode's load predictors beside `ConstantPredictor` and `MovingAveragePredictor`
(planner/sla.py): `KalmanPredictor`, and `make_predictor(kind, window)`.

`KalmanPredictor` is statsmodels' `UnobservedComponents` with a local linear trend: a level
and a slope, each a random walk, estimated by the Kalman filter with the noise variances fitted
by maximum likelihood on the last `window` observations. Chosen over ARIMA because the model is
fixed (no order search, so one fit per interval costs a few ms on a 10-point window), it says
what it does (how fast the level and the trend move against the noise), and it extrapolates a
ramp one interval ahead, which is what the SLA mode is for: a moving average trails a rising
load by half its window. The flip side: a single spike reads as the start of a trend for an
interval or two (the decision moves replicas by one per interval, which bounds the cost).

Safety: under `min_observations` the forecast is the last value; a window of one value (a
constant series, where the likelihood has no maximum) forecasts that value without fitting;
a fit that fails or forecasts a non-finite number falls back to the last value. A forecast is
never negative (a rate and a length are not). A fit takes milliseconds: the caller runs
forecasts off the event loop (planner/sla_mode.py).
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from collections import deque

from planner.config import PredictorKind
from planner.sla import ConstantPredictor, MovingAveragePredictor, Predictor

MIN_OBSERVATIONS = 5  # fewer points than this and the trend's variances are not identifiable


class KalmanPredictor:
    def __init__(self, window: int, min_observations: int = MIN_OBSERVATIONS) -> None:
        if window < min_observations:
            raise ValueError(f"kalman window must be >= {min_observations}, not {window}")
        if importlib.util.find_spec("statsmodels") is None:
            # An optional extra: said at start-up, not at the first forecast.
            raise ValueError(
                "load_predictor kalman needs statsmodels: pip install 'fleet-proxy[kalman]'"
            )
        self._values: deque[float] = deque(maxlen=window)
        self._min = min_observations

    def observe(self, x: float) -> None:
        self._values.append(x)

    def predict(self) -> float | None:
        if not self._values:
            return None
        last = self._values[-1]
        if len(self._values) < self._min or min(self._values) == max(self._values):
            return last
        forecast = _fit_forecast(list(self._values))
        if forecast is None or not math.isfinite(forecast):
            return last
        return max(0.0, forecast)


def _fit_forecast(values: list[float]) -> float | None:
    # Imported here: statsmodels takes most of a second to import, which the proxy and the
    # load-based planner should not pay.
    import numpy as np
    from statsmodels.tsa.statespace.structural import UnobservedComponents

    try:
        with warnings.catch_warnings():
            # Convergence warnings on short or flat windows: the forecast is still usable,
            # and a bad one is caught below.
            warnings.simplefilter("ignore")
            model = UnobservedComponents(
                np.asarray(values, dtype=float), level="local linear trend"
            )
            result = model.fit(disp=False)
            return float(result.forecast(1)[0])
    except Exception:  # any numerical failure: the caller falls back to the last value
        return None


def make_predictor(kind: PredictorKind, window: int) -> Predictor:
    """A fresh predictor of `kind`; `window` is the moving average's span and the model's
    fitting window (at least MIN_OBSERVATIONS for the model)."""
    if kind is PredictorKind.MOVING_AVERAGE:
        return MovingAveragePredictor(window)
    if kind is PredictorKind.KALMAN:
        return KalmanPredictor(max(window, MIN_OBSERVATIONS))
    return ConstantPredictor()
