"""Failover under load: kill one of four simulated engines mid-run and count what clients see.

Starts `fleet-proxy sim` with 4 engines and `fleet-proxy serve` in front of them, drives a
steady load of streamed chat requests from `--clients` concurrent clients for `--duration`
seconds, and crashes one engine halfway (its port then refuses connections and its open
streams are cut, as when a vLLM process dies). Reports:

- client-visible errors (target 0) and completed requests (target 100%);
- migration downtime as the client sees it: the longest gap between two events of a moved
  stream, p50/p99 over moved streams; against a target of twice the median inter-token gap plus
  the median time to first token of unmoved requests (one decode step each side of the cut,
  plus the prefill of the moved context on the target);
- the proxy's own migration counters.

Each request sends `x-fleet-debug: 1` (the proxy runs with debug_receipts on), so its stream
ends with an SSE comment listing its legs: that is how a moved stream is told from one that
was not.

    python scripts/bench_failover.py [--clients 48] [--duration 20] [--tokens 96]

Everything runs on 127.0.0.1, bounded by --duration; results go to runs/failover-<time>/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import orjson
from localproc import ROOT, ChildExited, free_ports, process, wait_http  # scripts/ on sys.path

MODEL = "sim-llama-8b"


@dataclass
class Outcome:
    ok: bool
    error: str = ""
    legs: int = 1
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)

    @property
    def max_gap(self) -> float:
        return max(self.gaps, default=0.0)


async def one_request(client: httpx.AsyncClient, url: str, tokens: int, prompt: str) -> Outcome:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    last: float | None = None
    out = Outcome(ok=False)
    done = False
    try:
        async with client.stream(
            "POST", url + "/v1/chat/completions", json=body, headers={"x-fleet-debug": "1"}
        ) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}"
                return out
            buf = b""
            async for chunk in r.aiter_bytes():
                buf += chunk
                while b"\n\n" in buf:
                    event, buf = buf.split(b"\n\n", 1)
                    now = time.perf_counter()
                    if event.startswith(b": x-fleet-legs "):
                        out.legs = len(orjson.loads(event[len(b": x-fleet-legs ") :]))
                        continue
                    if event == b"data: [DONE]":
                        done = True
                        continue
                    if b'"error"' in event[:20]:
                        out.error = event[6:200].decode(errors="replace")
                        return out
                    if b'"role"' in event:
                        continue  # a chat stream's opening, sent before any token
                    if last is None:
                        out.ttft = now - started
                    else:
                        out.gaps.append(now - last)
                    last = now
    except httpx.HTTPError as e:
        out.error = f"{type(e).__name__}: {e}"
        return out
    out.ok = done
    if not done:
        out.error = "no [DONE]"
    return out


async def drive(url: str, clients: int, duration: float, tokens: int) -> list[Outcome]:
    deadline = time.monotonic() + duration
    results: list[Outcome] = []
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients)

    async with httpx.AsyncClient(timeout=120, limits=limits) as client:

        async def worker(i: int) -> None:
            n = 0
            while time.monotonic() < deadline:
                prompt = f"client {i} request {n}: tell me about the stone road at dawn " * 4
                results.append(await one_request(client, url, tokens, prompt))
                n += 1

        await asyncio.gather(*(worker(i) for i in range(clients)))
    return results


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def proxy_counters(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(
            (
                "fleet_proxy_migrations_total",
                "fleet_proxy_passive_ejections_total",
                "fleet_proxy_migration_downtime_seconds_sum",
                "fleet_proxy_migration_downtime_seconds_count",
            )
        ):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


async def run(args: argparse.Namespace, out_dir: Path) -> dict[str, object]:
    ports = free_ports(5)
    engines, proxy_port = ports[:4], ports[4]
    py = sys.executable
    with contextlib.ExitStack() as stack:
        sim_log = out_dir / "sim.log"
        sim = stack.enter_context(
            process(
                [py, "-m", "proxy.serving.cli", "sim", "--engines", "4",
                 "--base-port", str(engines[0]),
                 "--speed", str(args.speed)],
                sim_log,
            )
        )  # fmt: skip
        for p in engines:
            wait_http(f"http://127.0.0.1:{p}/health", proc=sim, log=sim_log)
        cmd = [py, "-m", "proxy.serving.cli", "serve", "--port", str(proxy_port), "--policy",
               "least_requests", "--log-level", "warning"]  # fmt: skip
        for p in engines:
            cmd += ["--backend", f"http://127.0.0.1:{p}"]
        # The receipts tell moved streams from the others.
        debug = {"FLEET_PROXY_DEBUG_RECEIPTS": "true"}
        proxy = stack.enter_context(process(cmd, out_dir / "proxy.log", env=debug))
        url = f"http://127.0.0.1:{proxy_port}"
        wait_http(url + "/ready", proc=proxy, log=out_dir / "proxy.log")
        victim = f"http://127.0.0.1:{engines[1]}"

        async def kill_halfway() -> float:
            await asyncio.sleep(args.duration / 2)
            async with httpx.AsyncClient(timeout=10) as c:
                await c.post(victim + "/_sim/faults", json={"crash": True})
            return time.monotonic()

        killer = asyncio.create_task(kill_halfway())
        results = await drive(url, args.clients, args.duration, args.tokens)
        await killer
        counters = proxy_counters(url)
    moved = [r for r in results if r.ok and r.legs > 1]
    calm = [r for r in results if r.ok and r.legs == 1]
    itl = statistics.median(g for r in calm for g in r.gaps) if calm else float("nan")
    ttft = statistics.median(r.ttft for r in calm) if calm else float("nan")
    downtime = [r.max_gap for r in moved]
    return {
        "clients": args.clients,
        "duration_s": args.duration,
        "tokens": args.tokens,
        "speed": args.speed,
        "requests": len(results),
        "completed": sum(r.ok for r in results),
        "client_errors": len([r for r in results if not r.ok]),
        "error_samples": sorted({r.error for r in results if not r.ok})[:5],
        "moved_streams": len(moved),
        "downtime_p50_s": pct(downtime, 0.5),
        "downtime_p99_s": pct(downtime, 0.99),
        "downtime_max_s": max(downtime, default=float("nan")),
        "median_itl_s": itl,
        "median_ttft_s": ttft,
        "target_s": 2 * itl + ttft,
        "proxy_counters": counters,
        "samples": [asdict(r) | {"gaps": None, "max_gap": r.max_gap} for r in moved][:50],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", type=int, default=48)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--tokens", type=int, default=96, help="max_tokens of every request")
    p.add_argument("--speed", type=float, default=1.0, help="the simulated engines' clock speed")
    args = p.parse_args()
    out_dir = ROOT / "runs" / time.strftime("failover-%Y%m%d-%H%M%S")
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        report = asyncio.run(run(args, out_dir))
    except ChildExited as e:  # its ports taken between free_ports and its start, say
        raise SystemExit(f"bench_failover.py: {e}") from None
    (out_dir / "results.json").write_text(json.dumps(report, indent=2))
    keys = [
        "requests", "completed", "client_errors", "moved_streams", "downtime_p50_s",
        "downtime_p99_s", "downtime_max_s", "median_itl_s", "median_ttft_s", "target_s",
    ]  # fmt: skip
    for k in keys:
        v = report[k]
        print(f"{k:>16}: {v:.4f}" if isinstance(v, float) else f"{k:>16}: {v}")
    print(f"{'proxy':>16}: {report['proxy_counters']}")
    if report["error_samples"]:
        print(f"{'errors':>16}: {report['error_samples']}")
    print(f"wrote {out_dir / 'results.json'}")


if __name__ == "__main__":
    main()
