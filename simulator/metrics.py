"""vLLM's /metrics for one simulated engine: the same names, labels and buckets as vLLM 0.32.

One CollectorRegistry per engine (no process globals). Gauges that mirror scheduler state are
read from the engine core when the page is rendered, so a scrape always sees the current state.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from fleet.lean_histogram import LeanHistogram
from simulator.core import CoreListener, EngineCore, Step
from simulator.lora import LoraConfig, LoraInfoGauge
from simulator.profiles import Profile
from simulator.request import SimRequest, Status

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
NIXL_TIME_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
PROMPT_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
CACHED_SOURCES = ("device", "host", "p2p", "disk", "external_unspecified")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST


def buckets_1_2_5(max_value: int) -> list[float]:
    """1, 2, 5, 10, 20, 50, ... up to max_value, as vLLM builds its token-count buckets."""
    out: list[float] = []
    exponent = 0
    while True:
        for m in (1, 2, 5):
            v = m * 10**exponent
            if v > max_value:
                return out
            out.append(float(v))
        exponent += 1


def _labelled(
    metric: Counter | Gauge, label: str, values: Sequence[str], lv: Sequence[str]
) -> dict[str, Counter | Gauge]:
    return {v: metric.labels(*lv, v) for v in values}


class SimMetrics(CoreListener):
    """The families of a vLLM 0.32 /metrics page, in its order (HTTP and process ones aside)."""

    def __init__(
        self,
        model_name: str,
        profile: Profile,
        engine_index: str = "0",
        lora: LoraConfig | None = None,
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        r = self.registry
        names = ["model_name", "engine"]
        lv = (model_name, engine_index)
        tok_buckets = buckets_1_2_5(profile.max_model_len)

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Counter:
            return Counter(name, doc, [*names, *extra], registry=r)

        def gauge(name: str, doc: str, extra: Sequence[str] = ()) -> Gauge:
            return Gauge(name, doc, [*names, *extra], registry=r, multiprocess_mode="mostrecent")

        def hist(name: str, doc: str, buckets: Sequence[float]) -> Histogram:
            return Histogram(name, doc, names, buckets=list(buckets), registry=r)

        # Roofline counters that vLLM publishes (zero on its CPU backend, as here).
        for what in ("flops", "read_bytes", "write_bytes"):
            counter(
                f"vllm:estimated_{what}_per_gpu",
                f"Estimated number of {what.replace('_', ' ')} per GPU.",
            ).labels(*lv)
        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        ).labels(*lv)
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        ).labels(*lv)
        by_reason = gauge(
            "vllm:num_requests_waiting_by_reason",
            "Number of requests waiting, by the reason they wait.",
            ["reason"],
        )
        self.waiting_capacity = by_reason.labels(*lv, "capacity")
        self.waiting_deferred = by_reason.labels(*lv, "deferred")
        fetch = gauge(
            "vllm:num_requests_kv_fetch_by_stage",
            "Number of waiting requests by async KV load stage.",
            ["stage"],
        )
        self.fetch_stage = {stage: fetch.labels(*lv, stage) for stage in KV_FETCH_STAGES}
        sleep = gauge("vllm:engine_sleep_state", "Engine sleep state.", ["sleep_state"])
        for state in SLEEP_STATES:
            sleep.labels(*lv, state).set(1 if state == "awake" else 0)
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        ).labels(*lv)
        self.prefix_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        ).labels(*lv)
        self.prefix_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        ).labels(*lv)
        for kind in ("external_prefix_cache", "mm_cache"):
            counter(f"vllm:{kind}_queries", f"{kind} queries.").labels(*lv)
            counter(f"vllm:{kind}_hits", f"{kind} hits.").labels(*lv)
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        ).labels(*lv)
        self.prompt_tokens = counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed."
        ).labels(*lv)
        self.prompt_by_source = _labelled(
            counter(
                "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.", ["source"]
            ),
            "source",
            PROMPT_SOURCES,
            lv,
        )
        self.prompt_cached = counter(
            "vllm:prompt_tokens_cached", "Number of cached prompt tokens."
        ).labels(*lv)
        self.prompt_cached_by_source = _labelled(
            counter(
                "vllm:prompt_tokens_cached_by_source",
                "Number of cached prompt tokens by source.",
                ["source"],
            ),
            "source",
            CACHED_SOURCES,
            lv,
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        ).labels(*lv)
        self._generated_seen = 0
        self.success = _labelled(
            counter(
                "vllm:request_success",
                "Count of successfully processed requests.",
                ["finished_reason"],
            ),
            "finished_reason",
            FINISH_REASONS,
            lv,
        )
        rejections = Counter(
            "vllm:admission_rejections_total",
            "Requests rejected at admission, by reason.",
            ["model_name", "reason"],
            registry=r,
        )
        for reason in ("max_num_queued_reqs", "max_num_queued_tokens"):
            rejections.labels(model_name, reason)

        self.req_prompt_tokens = hist(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", tok_buckets
        ).labels(*lv)
        self.req_generation_tokens = hist(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", tok_buckets
        ).labels(*lv)
        self.iteration_tokens = hist(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384],
        ).labels(*lv)
        self.req_max_generation = hist(
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            tok_buckets,
        ).labels(*lv)
        self.req_n = hist(
            "vllm:request_params_n", "Histogram of the n request parameter.", [1, 2, 5, 10, 20]
        ).labels(*lv)
        self.req_max_tokens = hist(
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            tok_buckets,
        ).labels(*lv)
        self.ttft = hist(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        ).labels(*lv)
        self.itl = LeanHistogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            names,
            buckets=ITL_BUCKETS,
            registry=r,
        ).labels(*lv)  # observed once per token: no lock per observation
        self.tpot = hist(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            ITL_BUCKETS,
        ).labels(*lv)
        self.e2e = hist(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.queue_time = hist(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.inference_time = hist(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.prefill_time = hist(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.decode_time = hist(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        ).labels(*lv)
        self.req_preemptions = hist(
            "vllm:request_num_preemptions",
            "Number of preemptions per request.",
            [1, 2, 3, 4, 5, 10, 20],
        ).labels(*lv)
        self.req_computed = hist(
            "vllm:request_prefill_kv_computed_tokens",
            "Prompt tokens computed (not from a cache) per request.",
            tok_buckets,
        ).labels(*lv)
        # NixlConnector's families, as an engine started with it publishes them (on both
        # sides of a transfer); the decode side observes its KV pulls.
        self.nixl_xfer_time = hist(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            NIXL_TIME_BUCKETS,
        ).labels(*lv)
        self.nixl_post_time = hist(
            "vllm:nixl_post_time_seconds",
            "Histogram of transfer post time for NIXL KV Cache transfers.",
            [0.001, *NIXL_TIME_BUCKETS],
        ).labels(*lv)
        self.nixl_bytes = hist(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            [float(2**k) for k in range(11, 34, 2)],
        ).labels(*lv)
        self.nixl_descriptors = hist(
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL KV Cache transfers.",
            [10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000],
        ).labels(*lv)
        self.nixl_failed_transfers = counter(
            "vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers."
        ).labels(*lv)
        counter(
            "vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications."
        ).labels(*lv)
        self.nixl_expired = counter(
            "vllm:nixl_num_kv_expired_reqs", "Number of requests whose KV blocks expired unread."
        ).labels(*lv)
        counter(
            "vllm:nixl_num_notifications_after_expiry",
            "Number of notifications received after the KV blocks expired.",
        ).labels(*lv)
        self.lora_info = (
            LoraInfoGauge(r, lora.max_loras) if lora is not None and lora.enabled else None
        )
        info = cache_config_labels(profile, engine_index)
        Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            list(info),
            registry=r,
            multiprocess_mode="mostrecent",
        ).labels(**info).set(1)

    # ---- CoreListener ---------------------------------------------------------------------
    def on_step(self, step: Step) -> None:
        self.iteration_tokens.observe(step.new_tokens)

    def on_preempt(self, req: SimRequest) -> None:
        self.preemptions.inc()

    def on_prefix_query(self, queried: int, hit: int) -> None:
        self.prefix_queries.inc(queried)
        if hit:
            self.prefix_hits.inc(hit)

    def on_token(self, req: SimRequest, now: float, first: bool) -> None:
        # vllm:generation_tokens_total is brought up to date at render time: one counter
        # update per scrape instead of one per token.
        if first:
            n = len(req.prompt_ids)
            cached, external = req.prefix_hit_tokens, req.external_tokens
            self.prompt_tokens.inc(n)
            self.prompt_by_source["local_compute"].inc(n - cached - external)
            if cached:
                self.prompt_by_source["local_cache_hit"].inc(cached)
                self.prompt_cached.inc(cached)
                self.prompt_cached_by_source["device"].inc(cached)
            if external:
                self.prompt_by_source["external_kv_transfer"].inc(external)
            self.ttft.observe(now - req.arrival)
        elif req.last_token_at is not None:
            self.itl.observe(now - req.last_token_at)

    def on_held_expired(self, req: SimRequest) -> None:
        self.nixl_expired.inc()

    def on_lora_state(self, running: list[str], waiting: list[str]) -> None:
        if self.lora_info is not None:
            self.lora_info.report(running, waiting)

    def on_finished(self, req: SimRequest) -> None:
        reason = req.finish_reason or "abort"
        self.success[reason if reason in self.success else "abort"].inc()
        if reason == "abort" or req.finished_at is None:
            return
        end = req.finished_at
        self.e2e.observe(end - req.arrival)
        self.req_prompt_tokens.observe(len(req.prompt_ids))
        self.req_generation_tokens.observe(len(req.output_ids))
        self.req_max_tokens.observe(req.params.max_tokens)
        self.req_max_generation.observe(req.params.max_tokens)
        self.req_n.observe(1)
        self.req_preemptions.observe(req.num_preemptions)
        self.req_computed.observe(len(req.prompt_ids) - req.prefix_hit_tokens - req.external_tokens)
        if req.first_scheduled is not None:
            self.queue_time.observe(req.first_scheduled - req.arrival)
            self.inference_time.observe(end - req.first_scheduled)
            if req.first_token_at is not None:
                self.prefill_time.observe(req.first_token_at - req.first_scheduled)
        if req.first_token_at is not None:
            self.decode_time.observe(end - req.first_token_at)
            if len(req.output_ids) > 1:
                self.tpot.observe((end - req.first_token_at) / (len(req.output_ids) - 1))

    # ---- rendering ------------------------------------------------------------------------
    def render(self, core: EngineCore) -> bytes:
        generated = core.counters.generation_tokens
        if generated > self._generated_seen:
            self.generation_tokens.inc(generated - self._generated_seen)
            self._generated_seen = generated
        self.running.set(len(core.running))
        self.waiting.set(core.num_waiting())
        self.waiting_capacity.set(core.num_waiting())
        self.waiting_deferred.set(0)
        self.kv_usage.set(core.pool.usage())
        fetching = sum(r.status is Status.WAITING_FOR_REMOTE_KVS for r in core.waiting)
        fetched = sum(r.status is Status.WAITING and r.external_tokens > 0 for r in core.waiting)
        self.fetch_stage["waiting_to_start"].set(0)  # pulls start on arrival here
        self.fetch_stage["in_progress"].set(fetching)
        self.fetch_stage["completed_waiting"].set(fetched)
        return generate_latest(self.registry)


def cache_config_labels(profile: Profile, engine_index: str) -> dict[str, str]:
    """vLLM 0.32's CacheConfig as labels; the router reads block_size, num_gpu_blocks and
    enable_prefix_caching, the rest keep the page the same shape."""
    tokens = profile.num_gpu_blocks * profile.block_size
    return {
        "_block_size_resolved": "True",
        "block_size": str(profile.block_size),
        "cache_dtype": "auto",
        "cache_hit_alignment_tokens": "None",
        "effective_attention_block_size": str(profile.block_size),
        "enable_mamba_shared_prefix_checkpoint": "False",
        "enable_prefix_caching": str(profile.enable_prefix_caching),
        "engine": engine_index,
        "gpu_memory_utilization": "0.9",
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_layout": "None",
        "kv_cache_max_concurrency": str(round(tokens / profile.max_model_len, 2)),
        "kv_cache_memory_bytes": str(tokens * profile.kv_bytes_per_token),
        "kv_cache_size_tokens": str(tokens),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "float32",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(profile.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_cache_retention_interval": "0",
        "prefix_caching_hash_algo": "sha256",
        "prefix_match_unit": "None",
        "replayssm_buffer_len": "16",
        "skip_page_size_padded": "None",
        "sliding_window": "None",
        "swa_bounded_replay": "True",
        "use_kda_recoverssm": "False",
        "use_replayssm": "False",
        "user_specified_block_size": "False",
    }
