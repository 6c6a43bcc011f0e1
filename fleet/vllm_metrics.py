"""vLLM /metrics text -> EngineMetrics.

The exposition is parsed with prometheus_client's parser (a well-kept, spec-following parser;
we do not hand-roll Prometheus text parsing). A vLLM page is mostly histogram buckets the
router never reads, so lines of other families are dropped before parsing: that keeps a 200 ms
scrape cadence cheap on the event loop.
"""

from __future__ import annotations

import re

from prometheus_client.parser import text_string_to_metric_families

from fleet.types import EngineMetrics

# Current names first, then the names older vLLM servers publish.
RUNNING = ("vllm:num_requests_running",)
WAITING = ("vllm:num_requests_waiting",)
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
PREFIX_QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
PREFIX_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
PREEMPTIONS = ("vllm:num_preemptions",)
PROMPT_TOKENS = ("vllm:prompt_tokens",)
GENERATION_TOKENS = ("vllm:generation_tokens",)
REQUEST_SUCCESS = ("vllm:request_success",)  # one series per finished_reason, summed
CACHE_CONFIG = ("vllm:cache_config_info",)
# One series per (max_lora, waiting, running) combination ever seen, valued with the time it
# was last set: the largest value is the engine's latest report.
LORA_INFO = ("vllm:lora_requests_info",)

WANTED: frozenset[str] = frozenset(
    RUNNING
    + WAITING
    + KV_USAGE
    + PREFIX_QUERIES
    + PREFIX_HITS
    + PREEMPTIONS
    + PROMPT_TOKENS
    + GENERATION_TOKENS
    + REQUEST_SUCCESS
    + CACHE_CONFIG
    + LORA_INFO
)
_SUFFIXES = ("_total", "_info")
# One C-speed pass picks the lines of the wanted families (samples and their TYPE) out of a
# ~50 KB page, matching names exactly, since one name can be a prefix of another
# (num_requests_waiting vs num_requests_waiting_by_reason). HELP text and the `_created`
# timestamps are left out: prometheus_client's parser costs ~20 us a line.
_RELEVANT = re.compile(
    r"^(?:# TYPE )?(?:"
    + "|".join(re.escape(n) for n in sorted(WANTED))
    + r")(?:_total|_info)?[{ ].*$",
    re.MULTILINE,
)


# Engine steps, the count of vLLM's per-step token histogram: the engine's heartbeat (it moves
# with every chunk of a long prefill, when the token counters do not). Only its _count line is
# read, straight from the text, rather than parse the histogram's buckets.
_STEPS = re.compile(r"^vllm:iteration_tokens_total_count(?:\{[^}]*\})? (\S+)", re.MULTILINE)


# The _sum and _count of the histograms the planner reads, in one pass straight from the text
# (their buckets are a dozen lines per engine the router never needs). Older vLLM names the
# inter-token latency time_per_output_token; the per-request
# `vllm:request_time_per_output_token_seconds` does not match (anchored).
_HISTOGRAMS = re.compile(
    r"^vllm:(inter_token_latency_seconds|time_per_output_token_seconds"
    r"|time_to_first_token_seconds|request_prompt_tokens|request_generation_tokens"
    r"|request_prefill_time_seconds|request_prefill_kv_computed_tokens)"
    r"_(sum|count)(?:\{[^}]*\})? (\S+)",
    re.MULTILINE,
)
_ITL_CURRENT = "inter_token_latency_seconds"
_ITL_OLDER = "time_per_output_token_seconds"


def _histograms(text: str) -> dict[str, tuple[float, float]]:
    """Histogram name -> (sum, count), summed over engines."""
    found: dict[str, list[float]] = {}
    for name, part, value in _HISTOGRAMS.findall(text):
        try:
            v = float(value)
        except ValueError:
            continue
        totals = found.setdefault(name, [0.0, 0.0])
        totals[0 if part == "sum" else 1] += v
    return {name: (t[0], t[1]) for name, t in found.items()}


def _family_of(name: str) -> str:
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and name[: -len(suffix)] in WANTED:
            return name[: -len(suffix)]
    return name


def relevant_lines(text: str) -> list[str]:
    """The lines of the families the router reads."""
    return _RELEVANT.findall(text)


def parse_engine_metrics(text: str) -> EngineMetrics:
    """Sum counts over the `engine` label (data-parallel ranks); KV usage takes the max."""
    sums: dict[str, float] = {}
    kv_usage = 0.0
    models: set[str] = set()
    block_size: int | None = None
    num_blocks: int | None = None
    prefix_caching: bool | None = None
    lora: dict[str, str] | None = None
    lora_at = float("-inf")
    filtered = "\n".join(relevant_lines(text)) + "\n"
    for family in text_string_to_metric_families(filtered):
        for sample in family.samples:
            base = _family_of(sample.name)
            labels = sample.labels
            model = labels.get("model_name")
            if model:
                models.add(model)
            if base in KV_USAGE:
                kv_usage = max(kv_usage, sample.value)
            elif base in CACHE_CONFIG:
                block_size = _int_or_none(labels.get("block_size"))
                num_blocks = _int_or_none(labels.get("num_gpu_blocks"))
                enabled = labels.get("enable_prefix_caching")
                if enabled is not None:
                    prefix_caching = enabled.lower() == "true"
            elif base in LORA_INFO:
                if sample.value > lora_at:
                    lora, lora_at = labels, sample.value
            else:
                sums[base] = sums.get(base, 0.0) + sample.value

    def first(names: tuple[str, ...]) -> float:
        for n in names:
            if n in sums:
                return sums[n]
        return 0.0

    steps = 0.0
    for value in _STEPS.findall(text):
        try:
            steps += float(value)
        except ValueError:
            continue
    hists = _histograms(text)
    # The current ITL name wins when a server publishes both.
    itl_sum, itl_count = hists.get(_ITL_CURRENT) or hists.get(_ITL_OLDER) or (0.0, 0.0)
    prompt_sum, prompt_count = hists.get("request_prompt_tokens", (0.0, 0.0))
    output_sum, output_count = hists.get("request_generation_tokens", (0.0, 0.0))
    ttft_sum, ttft_count = hists.get("time_to_first_token_seconds", (0.0, 0.0))
    prefill_sum, prefill_count = hists.get("request_prefill_time_seconds", (0.0, 0.0))
    computed_sum, computed_count = hists.get("request_prefill_kv_computed_tokens", (0.0, 0.0))
    return EngineMetrics(
        running=first(RUNNING),
        waiting=first(WAITING),
        kv_usage=kv_usage,
        prefix_queries=first(PREFIX_QUERIES),
        prefix_hits=first(PREFIX_HITS),
        preemptions=first(PREEMPTIONS),
        prompt_tokens=first(PROMPT_TOKENS),
        generation_tokens=first(GENERATION_TOKENS),
        steps=steps,
        itl_sum=itl_sum,
        itl_count=itl_count,
        requests_finished=first(REQUEST_SUCCESS),
        prompt_len_sum=prompt_sum,
        prompt_len_count=prompt_count,
        output_len_sum=output_sum,
        output_len_count=output_count,
        ttft_sum=ttft_sum,
        ttft_count=ttft_count,
        prefill_time_sum=prefill_sum,
        prefill_time_count=prefill_count,
        prefill_computed_sum=computed_sum,
        prefill_computed_count=computed_count,
        lora_running=_adapters(lora, "running_lora_adapters"),
        lora_waiting=_adapters(lora, "waiting_lora_adapters"),
        max_lora=None if lora is None else _int_or_none(lora.get("max_lora")),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        enable_prefix_caching=prefix_caching,
        models=tuple(sorted(models)),
    )


def _adapters(labels: dict[str, str] | None, key: str) -> tuple[str, ...]:
    """A label of comma-separated adapter names (empty: none)."""
    value = "" if labels is None else labels.get(key, "")
    return tuple(a for a in value.split(",") if a)


def _int_or_none(value: str | None) -> int | None:
    if value is None or value in ("", "None"):
        return None
    try:
        return int(float(value))
    except ValueError:
        return None
