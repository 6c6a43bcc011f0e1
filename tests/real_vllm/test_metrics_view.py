"""The proxy's scraper reads the real engines' /metrics, and its view matches them.

The engine side is parsed here with prometheus_client directly, independently of
fleet/vllm_metrics.py, and compared with what GET /admin/backends reports.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.real_vllm.tier import Proxy, Tier, cache_config, engine_samples
from tests.support.polling import holds_within_blocking

pytestmark = pytest.mark.real_vllm

SCRAPE_WAIT = 10.0  # seconds to let the proxy's scraper (0.2 s cadence) catch up


ENGINE_NAMES = {
    "running": "vllm:num_requests_running",
    "waiting": "vllm:num_requests_waiting",
    "kv_usage": "vllm:kv_cache_usage_perc",
    "prefix_queries": "vllm:prefix_cache_queries_total",
    "prefix_hits": "vllm:prefix_cache_hits_total",
}


def engine_view(url: str) -> dict[str, float]:
    """One read of the engine's /metrics (a busy engine can take seconds to render it)."""
    samples = engine_samples(url)
    return {
        key: sum(value for sample, _, value in samples if sample == name)
        for key, name in ENGINE_NAMES.items()
    }


def proxy_view(proxy: Proxy, backend_id: str) -> dict[str, float]:
    metrics = proxy.backend(backend_id)["metrics"]
    assert metrics is not None, f"the proxy has not scraped {backend_id} yet"
    return {
        k: float(metrics[k])
        for k in ("running", "waiting", "kv_usage", "prefix_queries", "prefix_hits")
    }


def test_idle_view_matches_each_engine(proxy: Proxy, tier: Tier) -> None:
    # Traffic with a repeated prompt first, so the counters being compared are not all zero.
    prompt = [100 + i % 50 for i in range(300)]
    for _ in range(len(tier.engines) * 2):
        r = httpx.post(
            f"{proxy.url}/v1/completions",
            timeout=120,
            json={"model": tier.model, "prompt": prompt, "max_tokens": 2},
        )
        assert r.status_code == 200
    for engine in tier.engines:
        expected = engine_view(engine.url)
        assert expected["prefix_queries"] > 0 and expected["prefix_hits"] > 0
        backend_id = engine.backend_id
        assert holds_within_blocking(
            lambda: proxy_view(proxy, backend_id) == expected,  # noqa: B023
            SCRAPE_WAIT,
        ), f"{backend_id}: proxy {proxy_view(proxy, backend_id)} != engine {expected}"
        seen = proxy.backend(engine.backend_id)["metrics"]
        config = cache_config(engine.url)
        assert seen["block_size"] == int(config["block_size"])
        assert seen["num_gpu_blocks"] == int(config["num_gpu_blocks"])
        assert seen["enable_prefix_caching"] is True
        assert seen["models"] == [tier.model]


# How long the engine is kept busy at most while the views are compared: on 2 cores a
# decoding engine saturates the machine and one read of its /metrics can take seconds.
BUSY_FOR = 150.0


def test_busy_view_shows_the_running_request_and_its_kv(proxy: Proxy, tier: Tier) -> None:
    """While an engine decodes, the proxy's scraped view shows one running request and KV in
    use, as the engine's own /metrics does; the idle engine shows none in both views.

    One long request finishes in a few seconds on a fast machine, and these CPU engines may
    hold a stream's output back and send it in one burst, so the engine is kept busy by a
    chain of long requests, one at a time, sent to it directly by a thread: the views are
    compared while the engine decodes, however fast it is or however it delivers output."""
    engine, other = tier.engines[0], tier.engines[1]
    stop = threading.Event()
    sent: list[int] = []
    chain = threading.Thread(target=keep_busy, args=(engine.url, tier.model, stop, sent))
    chain.start()
    try:

        def engine_busy() -> bool:
            view = engine_view(engine.url)
            return bool(view["running"] == 1 and view["kv_usage"] > 0)

        def proxy_busy() -> bool:
            view = proxy_view(proxy, engine.backend_id)
            return bool(view["running"] == 1 and view["kv_usage"] > 0)

        assert holds_within_blocking(lambda: engine_busy() and proxy_busy(), BUSY_FOR - 30), (
            engine_view(engine.url),
            proxy_view(proxy, engine.backend_id),
        )
        assert (
            proxy_view(proxy, other.backend_id)["running"] == engine_view(other.url)["running"] == 0
        )
    finally:
        stop.set()
        chain.join(timeout=120)
    assert sent, "the chain sent no request"
    # The chain has ended its last request; the proxy's view follows the engine to idle.
    assert holds_within_blocking(
        lambda: proxy_view(proxy, engine.backend_id)["running"] == 0, SCRAPE_WAIT
    )


def keep_busy(url: str, model: str, stop: threading.Event, sent: list[int]) -> None:
    """Send long completions to `url` one after another until `stop` or BUSY_FOR seconds."""
    body = {
        "model": model,
        "prompt": [200 + i % 40 for i in range(600)],
        "max_tokens": 3000,
        "ignore_eos": True,
    }
    deadline = time.monotonic() + BUSY_FOR
    with httpx.Client(timeout=120) as client:
        while not stop.is_set() and time.monotonic() < deadline:
            r = client.post(f"{url}/v1/completions", json=body)
            sent.append(r.status_code)
            assert r.status_code == 200, r.text
