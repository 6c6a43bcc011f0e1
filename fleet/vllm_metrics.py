"""vLLM /metrics text -> EngineMetrics.

The proxy reads about twenty series out of a ~50 KB page, five times a second per engine, so
the page is read in one pass of its own: each line is kept or dropped by one C-speed
`startswith` against the wanted names, and only the kept lines (a dozen or two) are split into
name, labels and value. prometheus_client's parser did the same work in 1.4 ms a page on this
machine (about 85 us a sample, most of it in its character-by-character label reader), the
largest part of an idle proxy's CPU with many engines; this reader, held to that parser's
results by tests/unit/fleet/test_vllm_metrics_reader.py, takes a fraction of it. It reads
what vLLM serves: the Prometheus text format, one sample a line, `name{labels} value
[timestamp]`, label values with `\\`, `\"` and `\n` escapes.
"""

from __future__ import annotations

import re

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

# Engine steps, the count of vLLM's per-step token histogram: the engine's heartbeat (it moves
# with every chunk of a long prefill, when the token counters do not). Only its _count line is
# read, not the histogram's buckets.
_STEPS = "vllm:iteration_tokens_total_count"

# The histograms whose _sum and _count the planner reads (their buckets are a dozen lines per
# engine the router never needs). Older vLLM names the inter-token latency
# time_per_output_token; the per-request `vllm:request_time_per_output_token_seconds` is
# another series.
_HISTOGRAM_NAMES = (
    "inter_token_latency_seconds",
    "time_per_output_token_seconds",
    "time_to_first_token_seconds",
    "request_prompt_tokens",
    "request_generation_tokens",
    "request_prefill_time_seconds",
    "request_prefill_kv_computed_tokens",
)
_HISTOGRAMS: dict[str, tuple[str, int]] = {
    f"vllm:{h}_{part}": (h, i) for h in _HISTOGRAM_NAMES for i, part in enumerate(("sum", "count"))
}
_ITL_CURRENT = "inter_token_latency_seconds"
_ITL_OLDER = "time_per_output_token_seconds"

# The family a wanted sample's name belongs to: the name itself, or it with _total / _info.
_FAMILY: dict[str, str] = {n + suffix: n for n in WANTED for suffix in ("", *_SUFFIXES)}
# Every line the reader keeps starts with one of these (a name may be a prefix of another,
# e.g. num_requests_waiting of num_requests_waiting_by_reason: the exact name is checked after).
_PREFIXES = tuple(sorted({*WANTED, _STEPS, *_HISTOGRAMS}))
# name{labels} value [timestamp]: the labels end at the line's last "}", since neither the
# value nor the timestamp holds one.
_SAMPLE = re.compile(r"([^{\s]+)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), "\\" + m.group(1)), value)


def labels_of(text: str | None) -> dict[str, str]:
    """The labels between a sample's braces."""
    if not text:
        return {}
    return {m.group(1): _unescape(m.group(2)) for m in _LABEL.finditer(text)}


def samples(text: str) -> list[tuple[str, str | None, float]]:
    """(name, labels text, value) of the page's samples the proxy reads, in page order;
    comment lines and unreadable values are skipped."""
    out: list[tuple[str, str | None, float]] = []
    for line in text.splitlines():
        if not line.startswith(_PREFIXES):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name = m.group(1)
        if name not in _FAMILY and name != _STEPS and name not in _HISTOGRAMS:
            continue  # a longer name that starts like a wanted one
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((name, m.group(2), value))
    return out


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
    steps = 0.0
    hists: dict[str, list[float]] = {}
    for name, label_text, value in samples(text):
        if name == _STEPS:
            steps += value
            continue
        histogram = _HISTOGRAMS.get(name)
        if histogram is not None:
            hists.setdefault(histogram[0], [0.0, 0.0])[histogram[1]] += value
            continue
        base = _FAMILY[name]
        labels = labels_of(label_text)
        model = labels.get("model_name")
        if model:
            models.add(model)
        if base in KV_USAGE:
            kv_usage = max(kv_usage, value)
        elif base in CACHE_CONFIG:
            block_size = _int_or_none(labels.get("block_size"))
            num_blocks = _int_or_none(labels.get("num_gpu_blocks"))
            enabled = labels.get("enable_prefix_caching")
            if enabled is not None:
                prefix_caching = enabled.lower() == "true"
        elif base in LORA_INFO:
            if value > lora_at:
                lora, lora_at = labels, value
        else:
            sums[base] = sums.get(base, 0.0) + value

    def first(names: tuple[str, ...]) -> float:
        for n in names:
            if n in sums:
                return sums[n]
        return 0.0

    def hist(name: str) -> tuple[float, float]:
        found = hists.get(name)
        return (found[0], found[1]) if found is not None else (0.0, 0.0)

    # The current ITL name wins when a server publishes both.
    itl_sum, itl_count = hist(_ITL_CURRENT) if _ITL_CURRENT in hists else hist(_ITL_OLDER)
    prompt_sum, prompt_count = hist("request_prompt_tokens")
    output_sum, output_count = hist("request_generation_tokens")
    ttft_sum, ttft_count = hist("time_to_first_token_seconds")
    prefill_sum, prefill_count = hist("request_prefill_time_seconds")
    computed_sum, computed_count = hist("request_prefill_kv_computed_tokens")
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
