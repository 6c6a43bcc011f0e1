"""When a request is shed (sheddable objective, saturated pool), the objectives' flags, and an
InferencePool read as pod discovery's terms."""

from __future__ import annotations

import pytest

from fleet.inference_pool import pool_target
from fleet.types import Backend, BackendSpec, EngineMetrics, MetricsSnapshot
from proxy.gateway.objectives import FixedPriorities
from proxy.gateway.shedding import OBJECTIVE_HEADER, Shedding
from proxy.serving.epp_cli import parse_objectives


def scraped(waiting: float, kv: float) -> Backend:
    b = Backend(BackendSpec(id="b", url="http://10.0.0.1:1"))
    b.snapshot = MetricsSnapshot(0.0, EngineMetrics(waiting=waiting, kv_usage=kv))
    return b


def test_a_request_is_sheddable_only_by_a_negative_objective() -> None:
    shed = Shedding(priorities=FixedPriorities({"batch": -1, "chat": 5}))
    assert shed.sheddable({OBJECTIVE_HEADER: "batch"})
    assert not shed.sheddable({OBJECTIVE_HEADER: "chat"})
    assert not shed.sheddable({OBJECTIVE_HEADER: "unknown"})
    assert not shed.sheddable({})


def test_the_pool_is_saturated_when_no_engine_has_room() -> None:
    shed = Shedding(queue_depth=5, kv_cache=0.8)
    assert not shed.saturated([scraped(6, 0.1), scraped(0, 0.5)])  # the second has room
    assert shed.saturated([scraped(6, 0.1), scraped(0, 0.9)])  # queue full, cache full
    unscraped = Backend(BackendSpec(id="u", url="http://10.0.0.1:2"))
    assert shed.saturated([unscraped])


def test_objective_flags() -> None:
    assert parse_objectives(["batch=-1", "chat=10"]) == {"batch": -1, "chat": 10}
    for bad in ("batch", "=1", "batch=high"):
        with pytest.raises(ValueError, match="NAME=PRIORITY"):
            parse_objectives([bad])


def test_an_inference_pool_is_its_selector_and_first_target_port() -> None:
    pool = {
        "spec": {
            "selector": {"matchLabels": {"tier": "gpu", "app": "vllm"}},
            "targetPorts": [{"number": 8000}, {"number": 8001}],
        }
    }
    target = pool_target(pool)
    assert (target.selector, target.port) == ("app=vllm,tier=gpu", 8000)
    with pytest.raises(ValueError, match="targetPorts"):
        pool_target({"spec": {"selector": {"matchLabels": {"a": "b"}}}})
