from __future__ import annotations

from typing import Any

import pytest

from rescheduler.config import LOAD_METRICS
from rescheduler.load import LOAD_METRIC_FUNCTIONS, load_metric, waiting_tokens
from rescheduler.view import InstanceView
from tests.unit.rescheduler.builders import inst, req

CAP: dict[str, Any] = {"num_gpu_blocks": 100, "block_size": 10}  # 1000 tokens


def test_every_configurable_metric_has_a_function() -> None:
    assert tuple(LOAD_METRIC_FUNCTIONS) == LOAD_METRICS


@pytest.mark.parametrize(
    ("instance", "expected"),
    [
        # used only
        (inst("a", kv_usage=0.5, **CAP), 0.5),
        # waiting requests' tokens (prompt + generated) on top of what is used
        (
            inst(
                "a",
                kv_usage=0.5,
                requests=(req("w", prompt=150, generated=50, running=False), req("r")),
                **CAP,
            ),
            0.7,
        ),
        # the proxy's pending charge when it exceeds the relayed waiting requests
        (
            inst(
                "a",
                kv_usage=0.2,
                pending_prefill_tokens=300,
                requests=(req("w", prompt=100, running=False),),
                **CAP,
            ),
            0.5,
        ),
        # the same requests counted once: relayed waiting tokens exceed the pending charge
        (
            inst(
                "a",
                kv_usage=0.2,
                pending_prefill_tokens=100,
                requests=(req("w", prompt=400, running=False),),
                **CAP,
            ),
            0.6,
        ),
        # capacity unknown: plain kv_usage, whatever is waiting
        (inst("a", kv_usage=0.3, pending_prefill_tokens=10_000), 0.3),
        # the projection may exceed 1: more is queued than fits
        (inst("a", kv_usage=0.9, pending_prefill_tokens=500, **CAP), 1.4),
    ],
)
def test_kv_cache_usage_ratio_projected(instance: InstanceView, expected: float) -> None:
    assert load_metric("kv_cache_usage_ratio_projected")(instance) == pytest.approx(expected)


def test_waiting_tokens_takes_the_larger_of_charge_and_relayed() -> None:
    waiting = (req("a", prompt=70, running=False), req("b", prompt=30, running=False))
    assert waiting_tokens(inst("x", pending_prefill_tokens=60, requests=waiting)) == 100
    assert waiting_tokens(inst("x", pending_prefill_tokens=160, requests=waiting)) == 160


BUSY = inst("a", kv_usage=0.42, num_running=7, num_waiting=3)


@pytest.mark.parametrize(
    ("metric", "expected"),
    [
        ("kv_cache_usage_ratio", 0.42),
        ("num_requests", 10),
        ("num_waiting_requests", 3),
        ("decode_batch_size", 7),
    ],
)
def test_plain_metrics(metric: str, expected: float) -> None:
    assert load_metric(metric)(BUSY) == pytest.approx(expected)


def test_unknown_metric_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="kv_cache_usage_ratio_projected"):
        load_metric("gpu_temperature")
