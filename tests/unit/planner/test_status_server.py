"""`fleet-proxy plan --metrics-port`: /metrics and /status over a real loopback socket, and the
port released when the block ends."""

from __future__ import annotations

import socket

import httpx

from planner.status_server import serving_status
from tests.unit.planner.test_observability import Aggregated


async def test_metrics_and_status_served_then_released() -> None:
    fleet = Aggregated(kv=0.95)
    await fleet.run(4)
    loop, registry = fleet.loop, fleet.registry
    async with serving_status(loop.status, registry, "127.0.0.1", 0) as port:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            metrics = await client.get(base + "/metrics")
            status = await client.get(base + "/status")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    line = 'fleet_proxy_planner_decisions_total{reason="scale_up_kv",role="decode"} 1.0'
    assert line in metrics.text
    assert status.status_code == 200
    body = status.json()
    assert body["decisions"][0]["decision"]["roles"][0]["desired"] == 2
    assert body["last_sample"]["decode_kv"] == 0.95
    with socket.socket() as s:  # the port is free again
        s.bind(("127.0.0.1", port))
