"""Backends' /metrics pages read over the proxy's own HTTP client (`UpstreamPool`).

The scraper reads every backend's page several times a second (5 a second each by default).
Over httpx a read of vLLM's ~50 KB page cost about 1.5 ms of CPU here, three times what
parsing it costs and most of an idle proxy's CPU; over that client it costs about 0.3 ms
(docs/performance.md). The proxy gives the scrapes a pool of their own (proxy/serving/
wiring.py says why); its connections are kept alive, carry the backends' API key and speak
TLS to https:// backends, as the forwarded requests' do.
"""

from __future__ import annotations

import asyncio

from fleet.scrape import PageUnavailable
from proxy.backends.upstream import Upstream, UpstreamError, split_url


class PooledMetricsPages:
    """`MetricsPages` (fleet/scrape.py) over a pool of the proxy's HTTP client."""

    def __init__(self, pool: Upstream, timeout: float) -> None:
        self._pool = pool
        self.timeout = timeout

    async def metrics_page(self, url: str) -> str:
        origin, path = split_url(url)
        timeout = self.timeout
        try:
            async with asyncio.timeout(timeout):
                resp = await self._pool.request(origin, path, (), b"", method=b"GET")
                async with resp:
                    body = await resp.read()
        except TimeoutError as e:
            raise PageUnavailable(f"no answer within {timeout:g} s") from e
        except UpstreamError as e:
            raise PageUnavailable(str(e)) from e
        if resp.status != 200:
            raise PageUnavailable(f"answered {resp.status}")
        return body.decode("utf-8", "replace")
