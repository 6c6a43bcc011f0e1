"""Predicted time per output token (TPOT) of a decode instance, from the engines' own numbers.

Each instance reports `recent_itl_s`, its mean inter-token latency over the last scrape
interval, and `num_running`, its decode batch. A decode step's time grows with the batch, so
the fleet (normally one model on every instance) is fitted with

    TPOT(batch) = a + b * batch

by least squares over the instances with an ITL and a batch > 0. Both coefficients must be
>= 0 (a step never gets faster with more work, nor takes negative time): when the
unconstrained fit breaks one, the other is refitted alone (b < 0 -> the mean ITL as a constant;
a < 0 -> the least-squares line through the origin). With fewer than two distinct batch sizes
a line cannot be fitted, so the model is proportional per request: a = 0 and
b = the mean of ITL / batch over the points.

An instance's TPOT at its batch plus `extra` requests is anchored on its own measurement when
it has one (its hardware, its sequence lengths):

    own_itl * model(batch + extra) / model(batch)

and is the fleet model at batch + extra otherwise. With no data anywhere, there is no model
and the TPOT is unknown (None).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rescheduler.view import InstanceView


@dataclass(frozen=True, slots=True)
class TpotModel:
    """TPOT(batch) = intercept + per_request * batch, in seconds."""

    intercept: float
    per_request: float

    def at(self, batch: float) -> float:
        return self.intercept + self.per_request * batch


def _points(instances: Iterable[InstanceView]) -> list[tuple[float, float]]:
    return [
        (i.num_running, i.recent_itl_s)
        for i in instances
        if i.recent_itl_s is not None and i.num_running > 0
    ]


def fit_tpot_model(instances: Iterable[InstanceView]) -> TpotModel | None:
    """The fleet's TPOT line (see the module doc), or None when no instance has data."""
    points = _points(instances)
    if not points:
        return None
    n = len(points)
    if len({x for x, _ in points}) < 2:
        return TpotModel(0.0, sum(y / x for x, y in points) / n)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    sxx = sum((x - mean_x) ** 2 for x, _ in points)
    sxy = sum((x - mean_x) * (y - mean_y) for x, y in points)
    slope = sxy / sxx
    intercept = mean_y - slope * mean_x
    if slope < 0:
        return TpotModel(max(0.0, mean_y), 0.0)
    if intercept < 0:
        through_origin = sum(x * y for x, y in points) / sum(x * x for x, _ in points)
        return TpotModel(0.0, max(0.0, through_origin))
    return TpotModel(intercept, slope)


def predict_tpot(
    instance: InstanceView, model: TpotModel | None, extra: float = 0.0
) -> float | None:
    """The instance's TPOT with `extra` more running requests; None when unknown."""
    if model is None:
        return None
    batch = instance.num_running
    fleet_now = model.at(batch)
    if instance.recent_itl_s is not None and batch > 0 and fleet_now > 0:
        return instance.recent_itl_s * model.at(batch + extra) / fleet_now
    return model.at(batch + extra)
