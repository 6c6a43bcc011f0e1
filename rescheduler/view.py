"""What the rescheduler's decision core sees and what it decides: plain, immutable data.

The loop (rescheduler/loop.py) builds a `ClusterView` each cycle, from the proxy's own state
when it runs inside `fleet-proxy serve`, or from a running proxy's admin API when it runs on
its own; `decide(view, config, now)` (rescheduler/decide.py) turns it into `Migration`s, and
the executor carries them out. Nothing here does I/O or reads a clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class InferType(StrEnum):
    """What an instance serves: a P/D prefill or decode worker, or both (neutral)."""

    PREFILL = "prefill"
    DECODE = "decode"
    NEUTRAL = "neutral"


@dataclass(frozen=True, slots=True)
class RequestView:
    """One live request on an instance, as the proxy relays it."""

    key: str  # unique among live requests (the upstream request id); what a migration names
    request_id: str  # the client's x-request-id, for logs
    arrived_at: float  # clock seconds when the proxy received it: the order of coming
    charged_prompt_tokens: int  # the uncached prompt part its backend was charged
    generated_tokens: int  # tokens the client has received
    running: bool  # its current backend has started answering; else it waits (queued/prefill)
    movable: bool  # a planned move may take it now

    @property
    def tokens(self) -> int:
        """Its sequence length: the KV it holds (or will hold) on the instance."""
        return self.charged_prompt_tokens + self.generated_tokens


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One backend: its place in the fleet, its engine's last scrape, the proxy's accounting."""

    id: str
    infer_type: InferType
    node: str = ""
    unit: str = ""
    # Healthy, not draining, not ejected: it may take new requests.
    schedulable: bool = True
    # Reserved for prefill by adaptive P/D (label `prefill_reserved: "true"`): binpacking
    # neither takes requests from it nor gives it any.
    prefill_reserved: bool = False
    # When its /metrics was last scraped (clock seconds); None when never.
    scraped_at: float | None = None
    # From the engine's /metrics.
    kv_usage: float = 0.0  # 0..1
    num_running: float = 0.0
    num_waiting: float = 0.0
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    # Mean inter-token latency over the last scrape interval (seconds), from the engine's
    # `vllm:inter_token_latency_seconds` histogram; None when no token was generated in it.
    recent_itl_s: float | None = None
    # The proxy's accounting: prompt tokens dispatched to it and not yet prefilled.
    pending_prefill_tokens: int = 0
    requests: tuple[RequestView, ...] = ()
    # A migration to or from it ended after its last scrape: its engine's numbers do not show
    # that yet, so balancing leaves it alone for now (else it would move the same load twice).
    settling: bool = False

    @property
    def capacity_tokens(self) -> int | None:
        """Its KV cache in tokens, when the engine published its cache config."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    @property
    def batch_size(self) -> float:
        return self.num_running + self.num_waiting


@dataclass(frozen=True, slots=True)
class ClusterView:
    taken_at: float  # clock seconds
    instances: tuple[InstanceView, ...]

    def get(self, instance_id: str) -> InstanceView | None:
        for i in self.instances:
            if i.id == instance_id:
                return i
        return None


@dataclass(frozen=True, slots=True)
class Migration:
    """Move `requests` (RequestView keys) from `source` to `target`, for `policy`."""

    policy: str
    source: str
    target: str
    requests: tuple[str, ...]
