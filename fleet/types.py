"""Backends as the router sees them.

A `Backend` joins three things of different lifetimes:
- `spec`: what the operator configured (immutable, replaced as a whole);
- `snapshot`: the latest scrape of the engine's /metrics (immutable, carries its age);
- `load`: the proxy's own live accounting (mutated on the hot path, read by policies).
Policies only read a Backend; the proxy and the scraper write it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

_EMPTY: Mapping[str, str] = MappingProxyType({})


# Whether a backend takes new requests now (Backend.readiness); plain ints, not an Enum:
# read once per candidate per request, where an Enum member lookup costs more.
CLOSED = 0
STALE = 1  # open, but its last scrape is older than stale_after
FRESH = 2


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    BOTH = "both"


@dataclass(frozen=True, slots=True)
class BackendSpec:
    id: str
    url: str  # base URL without a trailing slash, e.g. http://127.0.0.1:8001
    role: Role = Role.BOTH
    node: str = ""
    unit: str = ""
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    # Models the backend serves, learned from its /v1/models; empty until learned.
    models: tuple[str, ...] = ()
    # Where it came from (fleet/discovery.py): `static` (settings), `admin` (the admin API) or
    # `kubernetes` (pod discovery). A source's reconcile touches only its own backends.
    source: str = "static"
    # One incarnation of the server behind the id (a pod's uid): a new one under the same id
    # is a new backend, never the old one's state updated in place.
    instance: str = ""
    # Where the engine publishes its KV-cache events (`tcp://HOST:PORT`, connected to), and
    # its replay socket for missed ones; "" when it publishes none (fleet/kv_events.py).
    kv_events_endpoint: str = ""
    kv_events_replay_endpoint: str = ""


@dataclass(frozen=True, slots=True)
class EngineMetrics:
    """The router-relevant part of one vLLM /metrics page, summed over `engine` labels."""

    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0  # 0..1
    prefix_queries: float = 0.0  # tokens, counter
    prefix_hits: float = 0.0  # tokens, counter
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    steps: float = 0.0  # engine steps taken (vllm:iteration_tokens_total's count)
    # vllm:inter_token_latency_seconds' _sum and _count (counters): the mean inter-token
    # latency between two scrapes is their deltas' ratio.
    itl_sum: float = 0.0
    itl_count: float = 0.0
    # Finished requests (vllm:request_success_total, summed over finish reasons) and the
    # _sum/_count of the per-request histograms of prompt length, output length and time to
    # first token (counters): an interval's request rate and means are their deltas.
    requests_finished: float = 0.0
    prompt_len_sum: float = 0.0  # tokens
    prompt_len_count: float = 0.0
    output_len_sum: float = 0.0  # tokens
    output_len_count: float = 0.0
    ttft_sum: float = 0.0  # seconds
    ttft_count: float = 0.0
    # Per finished request: seconds in the prefill phase (vllm:request_prefill_time_seconds)
    # and prompt tokens computed rather than found in a cache
    # (vllm:request_prefill_kv_computed_tokens); their deltas' ratio is a prefill rate.
    prefill_time_sum: float = 0.0
    prefill_time_count: float = 0.0
    prefill_computed_sum: float = 0.0
    prefill_computed_count: float = 0.0
    # From the latest series of vllm:lora_requests_info, when LoRA is enabled: adapters of
    # running and of waiting requests, and the engine's max_loras.
    lora_running: tuple[str, ...] = ()
    lora_waiting: tuple[str, ...] = ()
    max_lora: int | None = None
    # From vllm:cache_config_info, when published.
    block_size: int | None = None
    num_gpu_blocks: int | None = None
    enable_prefix_caching: bool | None = None
    models: tuple[str, ...] = ()  # model_name label values seen


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    taken_at: float  # clock seconds when the scrape completed
    metrics: EngineMetrics
    # The proxy's requests on the backend (every worker's) when the snapshot was taken in;
    # None: not known. Against the count now it tells what the engine's queue did since.
    in_flight: int | None = None

    def age(self, now: float) -> float:
        return now - self.taken_at


@dataclass(slots=True)
class Load:
    """The proxy's own accounting for one backend (proxy/backends/accounting.py's Dispatch): charged
    at dispatch, pending prefill released when the prompt is processed, a decode counted at the
    first output, all released when the request ends or moves. Never touched per chunk."""

    in_flight: int = 0
    pending_prefill_tokens: int = 0  # charged at dispatch, released at the first token
    running_decodes: int = 0  # requests past their first token
    dispatched_total: int = 0
    # The same three counts from the proxy's other worker processes (`--workers N`, written by
    # fleet/peer_load.py every few ms); always 0 with one worker. Routing reads the totals
    # through policies/loads.py.
    peer_in_flight: int = 0
    peer_pending_prefill_tokens: int = 0
    peer_running_decodes: int = 0


@dataclass(slots=True, eq=False)
class Backend:
    spec: BackendSpec
    load: Load = field(default_factory=Load)
    snapshot: MetricsSnapshot | None = None
    # The scrape before `snapshot`: counters' deltas between the two (the rescheduler's
    # recent inter-token latency).
    previous_snapshot: MetricsSnapshot | None = None
    healthy: bool = True  # result of the last /health probe
    draining: bool = False  # admin asked: no new requests
    last_error: str = ""
    # The longest context the backend takes (prompt + output), from its /v1/models.
    max_model_len: int | None = None
    # Its models that are LoRA adapters (a `parent` in /v1/models): their KV-cache blocks are
    # hashed with the adapter, so the engines' events are matched for base-model prompts only.
    adapters: frozenset[str] = frozenset()
    # Out of routing until this clock time: its requests kept failing (fleet/outliers.py).
    ejected_until: float = 0.0
    # The last scrape whose step or token counters had moved: the engine was working.
    progress_at: float | None = None

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def url(self) -> str:
        return self.spec.url

    @property
    def role(self) -> Role:
        return self.spec.role

    def readiness(self, now: float, stale_after: float) -> int:
        """The one rule for taking new requests: healthy, not draining, not ejected, and a
        scrape no older than `stale_after` (FRESH); the same with an older scrape is STALE,
        which FleetRegistry.candidates falls back on when every scrape is late. One call per
        candidate per request: plain comparisons."""
        snap = self.snapshot
        if not self.healthy or self.draining or now < self.ejected_until or snap is None:
            return CLOSED
        return STALE if now - snap.taken_at > stale_after else FRESH

    def routable(self, now: float, stale_after: float) -> bool:
        return self.readiness(now, stale_after) == FRESH
