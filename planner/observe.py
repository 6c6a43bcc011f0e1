"""What one metric pull yields: per-worker numbers -> `Sample`.

As Dynamo's load-based planner measures load:
- prefill: the prefill queue as a utilisation of the prefill workers' capacity,

      prefill_queue = sum(num_requests_waiting) / sum(capacity)   over the prefill workers

  where a worker's `capacity` is how many requests it prefills at once. It defaults to 1: a
  long prompt saturates a prefill engine (the profiling assumes no in-flight batching), so the
  utilisation is the number of queued requests per prefill worker.
- decode (or aggregated): the mean KV-cache utilisation of the decode-side workers,

      decode_kv = sum(kv_cache_usage) / count                     over the decode-side workers

A worker of role `both` serves decode (it is an aggregated worker), so it counts on the decode
side. A side with no worker has no value (None), not 0: an empty pool is not an idle one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from fleet.types import Role
from planner.traffic import BackendReading


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's numbers from the proxy's latest scrape of it."""

    role: Role
    num_requests_waiting: float
    kv_cache_usage: float  # 0..1
    capacity: float = 1.0  # requests it prefills at once (prefill workers)
    reading: BackendReading | None = None  # its request counters (the SLA mode's input)


@dataclass(frozen=True, slots=True)
class Sample:
    """One metric pull."""

    at: float
    prefill_queue: float | None  # queued prefill requests per unit of prefill capacity
    decode_kv: float | None  # mean KV-cache utilisation of the decode-side workers, 0..1
    prefill_replicas: int  # workers the values were computed over
    decode_replicas: int
    # The workers' request counters at this pull, for the SLA mode (planner/traffic.py).
    readings: tuple[BackendReading, ...] = ()


def sample(at: float, workers: Iterable[WorkerLoad]) -> Sample:
    waiting = capacity = kv = 0.0
    prefill = decode = 0
    readings: list[BackendReading] = []
    for w in workers:
        if w.reading is not None:
            readings.append(w.reading)
        if w.role is Role.PREFILL:
            prefill += 1
            waiting += w.num_requests_waiting
            capacity += w.capacity
        else:
            decode += 1
            kv += w.kv_cache_usage
    return Sample(
        at=at,
        prefill_queue=waiting / capacity if capacity > 0 else None,
        decode_kv=kv / decode if decode else None,
        prefill_replicas=prefill,
        decode_replicas=decode,
        readings=tuple(readings),
    )
