"""Reading the proxy's own /metrics from a test."""

from __future__ import annotations

import httpx


async def metric(c: httpx.AsyncClient, name: str) -> float:
    """The value of an unlabelled sample `name` on the proxy `c` talks to."""
    for line in (await c.get("/metrics")).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no {name} in /metrics")


async def body_bytes_in_flight(c: httpx.AsyncClient) -> float:
    return await metric(c, "fleet_proxy_body_bytes_in_flight")
