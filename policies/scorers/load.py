"""Load scorers: queue depth, KV-cache utilisation, running requests, token load.

Each reads the larger of the proxy's own live accounting and the last scrape, so a burst the
scraper has not seen yet still counts, and so does load that other clients put on the engine.
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.framework import PluginBase, SchedulingRequest
from policies.loads import kv_usage, pending_prefill_tokens, queue_size, running_size
from policies.scorers.normalize import inverse_min_max


class QueueDepthScorer(PluginBase):
    """Shorter queue (waiting requests, or dispatched ones without a first token) scores higher."""

    type = "queue-depth-scorer"

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        return inverse_min_max([queue_size(b) for b in candidates])


def free_kv(b: Backend) -> float:
    used = kv_usage(b)
    return 1.0 if used <= 0.0 else 0.0 if used >= 1.0 else 1.0 - used


class KvCacheUtilizationScorer(PluginBase):
    """1 - KV-cache usage. A backend not scraped yet reads as 0% used, so it scores 1 (the
    most free), as does one whose scrape reports 0 or less."""

    type = "kv-cache-utilization-scorer"

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        return [free_kv(b) for b in candidates]


class RunningRequestsScorer(PluginBase):
    """Fewer running (decoding) requests score higher."""

    type = "running-requests-size-scorer"

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        return inverse_min_max([running_size(b) for b in candidates])


def token_load(b: Backend) -> float:
    """Tokens the engine holds or must still prefill: pending prefill tokens (our accounting)
    plus KV tokens in use, when the backend publishes its cache size."""
    load = float(pending_prefill_tokens(b))
    if b.snapshot is None:
        return load
    m = b.snapshot.metrics
    if m.block_size and m.num_gpu_blocks:
        load += m.kv_usage * m.block_size * m.num_gpu_blocks
    return load


class TokenLoadScorer(PluginBase):
    type = "token-load-scorer"

    def score(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> list[float]:
        return inverse_min_max([token_load(b) for b in candidates])
