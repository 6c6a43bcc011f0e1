"""One metric pull: the prefill queue per unit of capacity, the mean decode KV."""

from __future__ import annotations

import pytest

from fleet.types import Role
from planner.observe import Sample, WorkerLoad, sample


def test_prefill_queue_is_waiting_over_capacity_and_kv_the_decode_mean() -> None:
    s = sample(
        7.0,
        [
            WorkerLoad(Role.PREFILL, num_requests_waiting=3, kv_cache_usage=0.9),
            WorkerLoad(Role.PREFILL, num_requests_waiting=0, kv_cache_usage=0.1),
            WorkerLoad(Role.DECODE, num_requests_waiting=5, kv_cache_usage=0.8),
            WorkerLoad(Role.BOTH, num_requests_waiting=0, kv_cache_usage=0.4),
        ],
    )
    # 3 queued over 2 prefill workers of capacity 1; KV (0.8 + 0.4) / 2; prefill KV ignored.
    assert (s.at, s.prefill_queue, s.prefill_replicas, s.decode_replicas) == (7.0, 1.5, 2, 2)
    assert s.decode_kv == pytest.approx(0.6)


def test_capacity_scales_the_queue() -> None:
    s = sample(
        0.0,
        [
            WorkerLoad(Role.PREFILL, 6, 0.0, capacity=4),
            WorkerLoad(Role.PREFILL, 0, 0.0, capacity=2),
        ],
    )
    assert s.prefill_queue == 1.0


def test_an_empty_side_has_no_value_not_zero() -> None:
    s = sample(0.0, [WorkerLoad(Role.BOTH, 2, 0.3)])
    assert (s.prefill_queue, s.decode_kv) == (None, 0.3)
    assert (s.prefill_replicas, s.decode_replicas) == (0, 1)
    assert sample(0.0, []) == Sample(0.0, None, None, 0, 0)
