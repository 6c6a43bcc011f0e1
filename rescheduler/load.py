"""Load metrics: how full an instance is, as one number the load-balancing policies compare.

Every metric is a pure function of an `InstanceView`; higher means more loaded.

- `kv_cache_usage_ratio_projected` = (used + waiting) / total, where
  total = the instance's KV capacity in tokens (`capacity_tokens`),
  used = kv_usage * total,
  waiting = max(pending_prefill_tokens, sum of `tokens` of its requests with running=False).
  The proxy's `pending_prefill_tokens` charge and the waiting requests it relays describe the
  same requests (dispatched, not yet prefilled), so adding them would count those tokens twice;
  the larger of the two is the better estimate of what is still to land in the cache.
  When the capacity is unknown (the engine published no cache config) the projection cannot
  be scaled to a ratio, so the metric falls back to plain `kv_usage`.
- `kv_cache_usage_ratio` = kv_usage.
- `num_requests` = num_running + num_waiting.
- `num_waiting_requests` = num_waiting.
- `decode_batch_size` = num_running.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from rescheduler.config import LOAD_METRICS
from rescheduler.view import InstanceView

LoadMetric = Callable[[InstanceView], float]


def waiting_tokens(instance: InstanceView) -> int:
    """Tokens dispatched to the instance and not yet in its KV cache (see the module doc)."""
    relayed = sum(r.tokens for r in instance.requests if not r.running)
    return max(instance.pending_prefill_tokens, relayed)


def kv_cache_usage_ratio_projected(instance: InstanceView) -> float:
    total = instance.capacity_tokens
    if not total:
        return instance.kv_usage
    used = instance.kv_usage * total
    return (used + waiting_tokens(instance)) / total


def kv_cache_usage_ratio(instance: InstanceView) -> float:
    return instance.kv_usage


def num_requests(instance: InstanceView) -> float:
    return instance.num_running + instance.num_waiting


def num_waiting_requests(instance: InstanceView) -> float:
    return instance.num_waiting


def decode_batch_size(instance: InstanceView) -> float:
    return instance.num_running


LOAD_METRIC_FUNCTIONS: Mapping[str, LoadMetric] = MappingProxyType(
    {
        "kv_cache_usage_ratio_projected": kv_cache_usage_ratio_projected,
        "kv_cache_usage_ratio": kv_cache_usage_ratio,
        "num_requests": num_requests,
        "num_waiting_requests": num_waiting_requests,
        "decode_batch_size": decode_batch_size,
    }
)


def load_metric(name: str) -> LoadMetric:
    """The metric called `name`; ValueError naming the known ones otherwise."""
    try:
        return LOAD_METRIC_FUNCTIONS[name]
    except KeyError:
        known = ", ".join(LOAD_METRICS)
        raise ValueError(f"unknown load metric {name!r}; known: {known}") from None
