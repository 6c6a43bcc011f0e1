"""Settings validation: every bad setting named at once."""

from __future__ import annotations

import dataclasses

import pytest

from planner.config import (
    PlannerConfig,
    PlannerMode,
    PlannerRole,
    PredictorKind,
    Topology,
    check_config,
)


def test_the_defaults_are_dynamos_and_valid() -> None:
    c = PlannerConfig()
    check_config(c)
    assert (c.metric_pulling_interval, c.adjustment_interval) == (1.0, 30.0)
    assert (c.decode_kv_scale_up_threshold, c.decode_kv_scale_down_threshold) == (0.9, 0.5)
    assert (c.prefill_queue_scale_up_threshold, c.prefill_queue_scale_down_threshold) == (0.5, 0.2)
    assert (c.max_gpu_budget, c.min_gpu_budget) == (8, 1)
    assert (c.new_decode_worker_grace_period, c.new_prefill_worker_queue_buffer_period) == (3, 3)
    assert not c.no_operation
    assert (c.mode, c.ttft_target, c.itl_target, c.sla_profile) == (
        PlannerMode.LOAD,
        None,
        None,
        None,
    )
    assert (c.load_predictor, c.load_predictor_window) == (PredictorKind.CONSTANT, 10)
    assert c.roles == (PlannerRole.PREFILL, PlannerRole.DECODE)
    assert PlannerConfig(topology=Topology.AGGREGATED).roles == (PlannerRole.DECODE,)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"metric_pulling_interval": 0}, "metric_pulling_interval must be > 0"),
        ({"adjustment_interval": 0.5}, "adjustment_interval must be >= metric_pulling_interval"),
        (
            {"decode_kv_scale_down_threshold": 0.9},
            "decode_kv_scale_down_threshold (0.9) must be below",
        ),
        ({"prefill_queue_scale_up_threshold": 0.1}, "prefill_queue_scale_down_threshold (0.2)"),
        ({"decode_kv_scale_up_threshold": 1.5}, "decode_kv_scale_up_threshold must be <= 1"),
        ({"decode_engine_num_gpu": 0}, "decode_engine_num_gpu must be >= 1"),
        ({"min_gpu_budget": 9}, "max_gpu_budget (8) must be >= min_gpu_budget (9)"),
        ({"min_decode_replicas": 0}, "min_decode_replicas must be >= 1"),
        ({"max_prefill_replicas": 0}, "max_prefill_replicas (0) must be >= min_prefill_replicas"),
        ({"prefill_engine_num_gpu": 8}, "the minimum replicas need 9 GPUs"),
        ({"new_decode_worker_grace_period": -1}, "new_decode_worker_grace_period must be >= 0"),
        ({"load_predictor_window": 0}, "load_predictor_window must be >= 1"),
        ({"mode": PlannerMode.SLA}, "sla mode needs ttft_target > 0"),
        ({"mode": PlannerMode.SLA, "ttft_target": 0.2}, "sla mode needs itl_target > 0"),
        (
            {"mode": PlannerMode.SLA, "ttft_target": 0.2, "itl_target": 0.02},
            "sla mode needs sla_profile",
        ),
    ],
)
def test_a_bad_setting_is_named(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match="invalid planner config") as e:
        check_config(dataclasses.replace(PlannerConfig(), **changes))  # type: ignore[arg-type]
    assert message in str(e.value)


def test_every_error_is_reported_at_once() -> None:
    with pytest.raises(ValueError) as e:
        check_config(PlannerConfig(metric_pulling_interval=0, decode_engine_num_gpu=0))
    assert "metric_pulling_interval" in str(e.value) and "decode_engine_num_gpu" in str(e.value)


def test_an_aggregated_fleet_ignores_prefill_bounds() -> None:
    check_config(PlannerConfig(topology=Topology.AGGREGATED, prefill_engine_num_gpu=8))


def test_sla_mode_with_targets_and_a_profile_is_valid() -> None:
    check_config(
        PlannerConfig(mode=PlannerMode.SLA, ttft_target=0.2, itl_target=0.02, sla_profile="p.json")
    )
