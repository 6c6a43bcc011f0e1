"""Noisy neighbour: does a quiet tenant keep its latency while another floods the fleet?

Starts simulated engines (few sequences each, so the fleet saturates), then fleet-proxy in this
process once per scenario: without flow control, with round-robin fairness and with
token-weighted fairness. In each, a noisy tenant keeps `--noisy-concurrency` long-prompt
requests in flight while a quiet tenant sends short requests one after another; the quiet
tenant's latencies and both tenants' request counts are printed per scenario.

Everything shares this machine: compare the scenarios of one run, on a quiet machine, and
read nothing absolute into the figures.

    python scripts/bench_flow_control.py [--duration 20] [--engines 2] [--max-num-seqs 4]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import httpx
import uvicorn

from proxy.serving.app import create_app
from proxy.serving.front_door import uvicorn_config
from proxy.settings import load_settings
from simulator.fleet import DEFAULT_MODEL, SimFleet, start_fleet
from simulator.profiles import DEFAULT_PROFILE, load_profile

SCENARIOS: dict[str, dict[str, Any] | None] = {
    "off": None,
    "round_robin": {"fairness": "round_robin"},
    "token_weighted": {"fairness": "token_weighted"},
}
LONG_PROMPT = "The fleet serves many tenants at once. " * 200  # ~8k characters
SHORT_PROMPT = "Say hello."


def body(prompt: str, max_tokens: int) -> dict[str, Any]:
    return {"model": DEFAULT_MODEL, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}


async def tenant_loop(
    client: httpx.AsyncClient, tenant: str, prompt: str, max_tokens: int, until: float,
    latencies: list[float], statuses: dict[int, int],
) -> None:  # fmt: skip
    headers = {"x-gateway-fairness-id": tenant}
    while time.monotonic() < until:
        start = time.monotonic()
        r = await client.post("/v1/completions", json=body(prompt, max_tokens), headers=headers)
        statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
        if r.status_code == 200:
            latencies.append(time.monotonic() - start)
        else:
            await asyncio.sleep(0.05)  # refused: back off a little, as a client would


async def scenario(fleet: SimFleet, flow: dict[str, Any] | None, args: argparse.Namespace) -> None:
    settings: dict[str, Any] = {"backends": fleet.urls, "scrape_interval": 0.05}
    if flow is not None:
        settings["flow_control"] = flow
    app = create_app(load_settings(settings))
    config = uvicorn_config(app, app.core.settings, port=0, loop="none", log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    for _ in range(600):  # bounded: 30 s for the proxy to listen
        if server.started or task.done():
            break
        await asyncio.sleep(0.05)  # uvicorn offers no event to wait on
    if not server.started:
        raise SystemExit("fleet-proxy did not start listening")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as c:
            for _ in range(600):  # bounded: 30 s for a first scrape of every engine
                ready = (await c.get("/ready")).json()
                if ready.get("backends") == len(fleet.urls):
                    break
                await asyncio.sleep(0.05)
            until = time.monotonic() + args.duration
            quiet: list[float] = []
            noisy: list[float] = []
            quiet_status: dict[int, int] = {}
            noisy_status: dict[int, int] = {}
            loops = [
                tenant_loop(c, "noisy", LONG_PROMPT, 32, until, noisy, noisy_status)
                for _ in range(args.noisy_concurrency)
            ]
            loops.append(tenant_loop(c, "quiet", SHORT_PROMPT, 32, until, quiet, quiet_status))
            await asyncio.gather(*loops)
        name = "off" if flow is None else flow["fairness"]
        q = sorted(quiet)
        p50 = statistics.median(q) if q else float("nan")
        p95 = q[int(0.95 * (len(q) - 1))] if q else float("nan")
        print(
            f"{name:>15}: quiet {len(q)} ok, p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms, "
            f"statuses {quiet_status}; noisy {len(noisy)} ok, statuses {noisy_status}"
        )
    finally:
        server.should_exit = True
        await task


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--duration", type=float, default=20.0, help="seconds per scenario")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--noisy-concurrency", type=int, default=32)
    p.add_argument("--speed", type=float, default=4.0, help="simulated time per real second")
    args = p.parse_args()
    profile = load_profile(DEFAULT_PROFILE).with_overrides(max_num_seqs=args.max_num_seqs)
    async with await start_fleet(args.engines, profile=profile, speed=args.speed) as fleet:
        for flow in SCENARIOS.values():
            await scenario(fleet, flow, args)


if __name__ == "__main__":
    asyncio.run(main())
