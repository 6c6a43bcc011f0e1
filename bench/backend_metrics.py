"""Per-backend /metrics snapshots around a run, and the prefix-cache deltas they imply."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

# Counters summed over `engine` labels; older vLLM names after the current ones.
COUNTERS: Mapping[str, tuple[str, ...]] = {
    "prefix_queries": ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"),
    "prefix_hits": ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"),
    "prompt_tokens": ("vllm:prompt_tokens_total",),
    "generation_tokens": ("vllm:generation_tokens_total",),
    "preemptions": ("vllm:num_preemptions_total",),
    "requests": ("vllm:request_success_total",),  # summed over finished_reason
}


def backend_id(url: str) -> str:
    """ "host:port" of a base URL: the id fleet-proxy puts in x-fleet-backend by default."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"


def parse_counters(text: str) -> dict[str, float]:
    """The COUNTERS of one /metrics page; a counter the page lacks is absent from the result."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0.0) + float(s.value)
    out: dict[str, float] = {}
    for key, names in COUNTERS.items():
        for name in names:
            if name in samples:
                out[key] = samples[name]
                break
    return out


def deltas(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        k: after[k] - before[k] for k in COUNTERS if k in after and k in before
    }
    q, h = out.get("prefix_queries"), out.get("prefix_hits")
    out["prefix_hit_rate"] = (h / q) if q and h is not None else None
    return out


async def fetch_metrics(urls: Sequence[str], timeout_s: float = 10.0) -> dict[str, str | None]:
    """Raw /metrics text per backend id; None where the fetch failed (a run still proceeds)."""

    async def one(http: aiohttp.ClientSession, url: str) -> str | None:
        target = url.rstrip("/")
        if not target.endswith("/metrics"):
            target += "/metrics"
        try:
            async with http.get(target) as resp:
                return await resp.text() if resp.status == 200 else None
        except (aiohttp.ClientError, TimeoutError):
            return None

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        texts = await asyncio.gather(*(one(http, u) for u in urls))
    return {backend_id(u): t for u, t in zip(urls, texts, strict=True)}


def summarize_snapshots(
    before: Mapping[str, str | None], after: Mapping[str, str | None]
) -> dict[str, Any]:
    """Per backend: counters before, after and their deltas; totals over all backends."""
    per: dict[str, Any] = {}
    total_q = total_h = 0.0
    served: list[float] = []  # requests finished per backend, for balance behind any router
    tokens: list[float] = []
    for bid in sorted(set(before) | set(after)):
        b, a = before.get(bid), after.get(bid)
        if b is None or a is None:
            per[bid] = {"error": "metrics unavailable"}
            continue
        cb, ca = parse_counters(b), parse_counters(a)
        d = deltas(cb, ca)
        total_q += d.get("prefix_queries") or 0.0
        total_h += d.get("prefix_hits") or 0.0
        if d.get("requests") is not None:
            served.append(d["requests"] or 0.0)
        if d.get("prompt_tokens") is not None:
            tokens.append((d["prompt_tokens"] or 0.0) + (d.get("generation_tokens") or 0.0))
        per[bid] = {"before": cb, "after": ca, "delta": d}
    return {
        "backends": per,
        "prefix_queries": total_q,
        "prefix_hits": total_h,
        "prefix_hit_rate": total_h / total_q if total_q else None,
        "requests_max_over_min": _max_over_min(served),
        "tokens_max_over_min": _max_over_min(tokens),
    }


def _max_over_min(values: Sequence[float]) -> float | None:
    if len(values) < 2 or min(values) <= 0:
        return None
    return max(values) / min(values)
