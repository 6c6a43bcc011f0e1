"""The proxy's scraper reads the real engines' /metrics, and its view matches them.

The engine side is parsed here with prometheus_client directly, independently of
fleet/vllm_metrics.py, and compared with what GET /admin/backends reports.
"""

from __future__ import annotations

import httpx
import pytest

from tests.real_vllm.tier import Engine, Proxy, Tier, cache_config, engine_metric, wait_until

pytestmark = pytest.mark.real_vllm

SCRAPE_WAIT = 10.0  # seconds to let the proxy's scraper (0.2 s cadence) catch up


def engine_view(url: str) -> dict[str, float]:
    return {
        "running": engine_metric(url, "vllm:num_requests_running"),
        "waiting": engine_metric(url, "vllm:num_requests_waiting"),
        "kv_usage": engine_metric(url, "vllm:kv_cache_usage_perc"),
        "prefix_queries": engine_metric(url, "vllm:prefix_cache_queries_total"),
        "prefix_hits": engine_metric(url, "vllm:prefix_cache_hits_total"),
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
        assert wait_until(lambda: proxy_view(proxy, backend_id) == expected, SCRAPE_WAIT), (  # noqa: B023
            f"{backend_id}: proxy {proxy_view(proxy, backend_id)} != engine {expected}"
        )
        seen = proxy.backend(engine.backend_id)["metrics"]
        config = cache_config(engine.url)
        assert seen["block_size"] == int(config["block_size"])
        assert seen["num_gpu_blocks"] == int(config["num_gpu_blocks"])
        assert seen["enable_prefix_caching"] is True
        assert seen["models"] == [tier.model]


# The 2-core machine's engines sometimes hold their output back for seconds and then send it
# in one burst; a request already complete when its first line arrives is tried again.
TRIES = 3


def test_busy_view_shows_the_running_request_and_its_kv(proxy: Proxy, tier: Tier) -> None:
    for _ in range(TRIES):
        engine = busy_view(proxy, tier)
        if engine is not None:
            break
    else:
        pytest.fail(f"in {TRIES} tries every request was complete before it could be seen")
    # Closing the stream ends the request on the engine; the proxy's view follows.
    assert wait_until(lambda: proxy_view(proxy, engine.backend_id)["running"] == 0, SCRAPE_WAIT)


def busy_view(proxy: Proxy, tier: Tier) -> Engine | None:
    """One try: the engine that ran the request, or None when it ended before it was seen."""
    body = {
        "model": tier.model,
        "prompt": [200 + i % 40 for i in range(600)],
        "max_tokens": 3000,
        "ignore_eos": True,
        "stream": True,
    }
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", f"{proxy.url}/v1/completions", json=body) as resp,
    ):
        assert resp.status_code == 200
        engine = tier.by_backend_id(resp.headers["x-fleet-backend"])
        finished_before = engine_metric(engine.url, "vllm:request_success_total")
        lines = resp.iter_lines()
        next(line for line in lines if line.startswith("data: "))  # the engine has started
        # Asked now, while it should run: the tiny model finishes 3,000 tokens in seconds
        # and this client reads no further, so the relay may end while the views are checked.
        if proxy.backend(engine.backend_id)["load"]["in_flight"] != 1:
            return None  # the whole stream came in one burst: nothing to see running

        # Both views must show one running request and some KV in use while it decodes.
        def engine_busy() -> bool:
            view = engine_view(engine.url)
            return bool(view["running"] == 1 and view["kv_usage"] > 0)

        def proxy_busy() -> bool:
            view = proxy_view(proxy, engine.backend_id)
            return bool(view["running"] == 1 and view["kv_usage"] > 0)

        if not wait_until(lambda: engine_busy() and proxy_busy(), SCRAPE_WAIT):
            # The engine may have generated it all in a burst while this client read nothing.
            done = engine_metric(engine.url, "vllm:request_success_total") > finished_before
            assert done, (engine_view(engine.url), proxy_view(proxy, engine.backend_id))
            return None
        other = tier.other_than(engine)
        assert (
            proxy_view(proxy, other.backend_id)["running"] == engine_view(other.url)["running"] == 0
        )
    return engine
