#!/usr/bin/env python
"""Benchmark: a planned move's downtime by kind (recompute, hand-over, pre-copy), on two
simulated H100 engines that transfer KV over their NIXL emulation, behind one fleet-proxy.

    .venv/bin/python scripts/bench_move_kinds.py [--sizes 1000 4000 16000] [--repeat 5]

For each prompt size and kind, `--repeat` streams (each with a prompt of its own, so no
target holds it cached beforehand) are moved after 8 events with `/admin/requests/{id}/migrate`
and `{"kind": KIND}`; the downtime is the migrate answer's `downtime_s` (the last token relayed
from the source to the first from the target, as the client sees it). Prints a Markdown table
of the median and max per size and kind.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from simulator.fleet import start_fleet  # noqa: E402
from tests.support.servers import fast_settings, running_proxy  # noqa: E402

KINDS = ("recompute", "handover", "precopy")


async def one_move(
    client: httpx.AsyncClient, url: str, prompt: str, kind: str
) -> tuple[float, int, str]:
    """Stream one request, move it after 8 events; (downtime_s, prompt tokens, kind used)."""
    body: dict[str, Any] = {
        "model": "sim-llama-8b",
        "prompt": prompt,
        "max_tokens": 64,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result: dict[str, Any] = {}
    usage: dict[str, Any] = {}
    events = 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        buf = b""
        async for chunk in r.aiter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: {"):
                    continue
                data = orjson.loads(event[6:])
                usage = data.get("usage") or usage
                events += 1
                if events == 8:
                    rid = r.headers["x-request-id"]
                    m = await client.post(
                        url + f"/admin/requests/{rid}/migrate", json={"kind": kind}
                    )
                    result = m.json()
    if result.get("outcome") != "ok":
        raise RuntimeError(f"move failed: {result}")
    return float(result["downtime_s"]), int(usage["prompt_tokens"]), str(result["kind"])


async def run(sizes: list[int], repeat: int) -> None:
    async with await start_fleet(2, speed=1.0) as fleet:
        backends = [
            {"url": u, "id": f"e{i}", "labels": {"kv_connector": "nixl"}}
            for i, u in enumerate(fleet.urls)
        ]
        settings = fast_settings(backends, policy="round_robin", log_level="warning")
        async with running_proxy(settings) as (url, _), httpx.AsyncClient(timeout=120) as client:
            print("| prompt tokens | kind | median downtime (ms) | max (ms) |")
            print("|---|---|---|---|")
            n = 0
            for size in sizes:
                for kind in KINDS:
                    downtimes: list[float] = []
                    tokens = 0
                    for _ in range(repeat):
                        n += 1
                        # The sim's tokenizer makes about one token of each short word.
                        prompt = f"Run {n}: " + "sea " * size
                        downtime, tokens, used = await one_move(client, url, prompt, kind)
                        if used != kind:
                            raise RuntimeError(f"asked {kind}, moved by {used}")
                        downtimes.append(downtime)
                    print(
                        f"| {tokens} | {kind} | {statistics.median(downtimes) * 1e3:.1f} "
                        f"| {max(downtimes) * 1e3:.1f} |",
                        flush=True,
                    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    asyncio.run(run(args.sizes, args.repeat))


if __name__ == "__main__":
    main()
