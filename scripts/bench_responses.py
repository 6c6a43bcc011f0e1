"""Responses API threads: the proxy's expansion against the full history sent each turn.

The same multi-turn threads (made from `--seed`) are run two ways through `fleet-proxy serve`
in front of `fleet-proxy sim` engines, all on 127.0.0.1:

- `expand`: each turn sends only its new user message and `previous_response_id`; the proxy
  loads the thread from its store and expands it into the input (what the Responses API is
  for);
- `full`: each turn sends the whole thread as its input (every earlier input item and the
  output items the earlier turns answered, as the proxy's expansion would) with
  `store: false`, the way a client that keeps its own history calls it.

Every turn is streamed; its time to first token is the time from sending it to its first
`response.output_text.delta` event. The proxy's CPU per request is its CPU time (from
/proc/PID/stat, as scripts/perf/bench_proxy_overhead.py reads it) over the run's requests,
read before the first request and after the last: it includes the proxy's background work
over the run (scrapes of the engines' metrics, health checks), which weighs more the fewer
requests a run has. Each run gets fresh engines and a fresh
proxy (so no run finds another's threads in an engine's prefix cache), and the two ways
alternate (expand, full, expand, full...) so that drift in the machine's load falls on both.

    python scripts/bench_responses.py [--threads 8] [--turns 4] [--concurrency 4] [--repeat 2]

Bounded: `--deadline` seconds for a run's requests (turns not started by then are skipped and
counted), a timeout on each request, `--repeat` runs a way. The processes it starts are stopped
by their PIDs. Results go to runs/responses-<time>/ (a JSON file a run, and report.md/.json).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "scripts" / "perf"))

from bench_proxy_overhead import cpu_seconds  # noqa: E402 - scripts/perf on sys.path, above
from localproc import ChildExited, free_ports, process, wait_http  # noqa: E402
from machine_load import cores, load_now  # noqa: E402
from sim_bench import fmt, pct, run_alternating  # noqa: E402

MODEL = "sim-llama-8b"
WAYS = ("expand", "full")
# The event that carries a finished response (its output items, its id).
_FINAL = re.compile(rb"^event: response\.(completed|incomplete)$", re.MULTILINE)
# The words the threads are made of.
WORDS = (
    "router", "engine", "cache", "prefix", "token", "stream", "thread", "answer", "model",
    "fleet", "request", "replica", "latency", "budget", "batch", "decode", "prefill", "block",
    "queue", "policy", "store", "history", "turn", "input", "output",
)  # fmt: skip


@dataclass
class Turn:
    thread: int
    index: int
    ttft_s: float | None  # None: no text delta came
    ok: bool
    error: str = ""


@dataclass
class Thread:
    opening: str
    questions: list[str]
    history: list[dict[str, Any]] = field(default_factory=list)  # the `full` way's input
    previous_id: str | None = None  # the `expand` way's last response


def threads_of(seed: int, n: int, turns: int, opening_words: int) -> list[Thread]:
    """`n` threads of `turns` user messages, the first opening with `opening_words` words;
    the same for a seed, whichever way runs them."""
    rng = random.Random(seed)

    def words(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))

    return [
        Thread(words(opening_words), [f"Question {t}: {words(12)}?" for t in range(turns)])
        for _ in range(n)
    ]


def turn_body(way: str, thread: Thread, index: int, tokens: int) -> dict[str, Any]:
    text = thread.questions[index]
    if index == 0:
        text = thread.opening + "\n" + text
    message = {"role": "user", "content": text}
    body: dict[str, Any] = {"model": MODEL, "max_output_tokens": tokens, "stream": True}
    if way == "expand":
        body["input"] = [message]
        if thread.previous_id is not None:
            body["previous_response_id"] = thread.previous_id
    else:
        thread.history.append(message)
        body["input"] = list(thread.history)
        body["store"] = False
    return body


async def one_turn(
    c: httpx.AsyncClient, way: str, thread: Thread, number: int, index: int, tokens: int
) -> Turn:
    body = turn_body(way, thread, index, tokens)
    sent = time.perf_counter()
    first: float | None = None
    final: dict[str, Any] | None = None
    async with c.stream("POST", "/v1/responses", content=orjson.dumps(body)) as r:
        if r.status_code != 200:
            await r.aread()
            return Turn(number, index, None, False, f"HTTP {r.status_code}: {r.text[:200]}")
        buf = b""
        async for chunk in r.aiter_bytes():
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if first is None and b"event: response.output_text.delta" in event:
                    first = time.perf_counter() - sent
                elif (
                    b"event: response.completed" in event or b"event: response.incomplete" in event
                ):
                    data = event.split(b"data: ", 1)[1]
                    final = orjson.loads(data)["response"]
    if final is None:
        return Turn(number, index, first, False, "no final response event")
    if way == "expand":
        thread.previous_id = final["id"]
    else:
        thread.history.extend(final["output"])
    return Turn(number, index, first, True)


async def drive(
    url: str, threads: list[Thread], args: argparse.Namespace, way: str
) -> tuple[list[Turn], int]:
    """Every thread's turns in order, `args.concurrency` threads at once, until the deadline:
    (turns run, turns skipped)."""
    deadline = time.monotonic() + args.deadline
    slots = asyncio.Semaphore(args.concurrency)
    turns: list[Turn] = []
    skipped = 0
    timeout = httpx.Timeout(args.request_timeout)

    async def run_thread(c: httpx.AsyncClient, number: int, thread: Thread) -> None:
        nonlocal skipped
        async with slots:
            for index in range(len(thread.questions)):
                if time.monotonic() > deadline:
                    skipped += len(thread.questions) - index
                    return
                try:
                    turn = await one_turn(c, way, thread, number, index, args.tokens)
                except httpx.HTTPError as e:
                    turn = Turn(number, index, None, False, f"{type(e).__name__}: {e}")
                turns.append(turn)
                if not turn.ok:
                    skipped += len(thread.questions) - index - 1
                    return

    async with httpx.AsyncClient(base_url=url, timeout=timeout) as c:
        await asyncio.gather(*(run_thread(c, i, t) for i, t in enumerate(threads)))
    return turns, skipped


def one_run(args: argparse.Namespace, out: Path, way: str, k: int) -> Path:
    """A run of one way on fresh engines and a fresh proxy; its results file."""
    ports = free_ports(args.engines + 1)
    engines, proxy_port = ports[: args.engines], ports[args.engines]
    logs = out / f"{way}-{k}"
    logs.mkdir()
    py = sys.executable
    with contextlib.ExitStack() as stack:
        sim_cmd = [py, "-m", "proxy.serving.cli", "sim", "--engines", str(args.engines),
                   "--base-port", str(engines[0]), "--speed", str(args.speed),
                   "--model", MODEL]  # fmt: skip
        sim = stack.enter_context(process(sim_cmd, logs / "sim.log"))
        for p in engines:
            wait_http(f"http://127.0.0.1:{p}/health", proc=sim, log=logs / "sim.log")
        cmd = [py, "-m", "proxy.serving.cli", "serve", "--port", str(proxy_port),
               "--policy", args.policy, "--log-level", "warning"]  # fmt: skip
        for p in engines:
            cmd += ["--backend", f"http://127.0.0.1:{p}"]
        proxy = stack.enter_context(process(cmd, logs / "proxy.log"))
        url = f"http://127.0.0.1:{proxy_port}"
        wait_http(url + "/ready", proc=proxy, log=logs / "proxy.log")
        threads = threads_of(args.seed, args.threads, args.turns, args.opening_words)
        load_before = load_now()
        cpu_before = cpu_seconds(proxy.pid)
        started = time.perf_counter()
        turns, skipped = asyncio.run(drive(url, threads, args, way))
        wall = time.perf_counter() - started
        cpu = cpu_seconds(proxy.pid) - cpu_before
        load_after = load_now()
    result = {
        "way": way,
        "run": k,
        "turns": [t.__dict__ for t in turns],
        "skipped": skipped,
        "proxy_cpu_s": cpu,
        "wall_s": wall,
        "load_before": load_before,
        "load_after": load_after,
        "cores": cores(),
    }
    path = out / f"{way}-{k}.json"
    path.write_bytes(orjson.dumps(result, option=orjson.OPT_INDENT_2))
    return path


def summary(paths: list[Path]) -> dict[str, Any]:
    runs = [orjson.loads(p.read_bytes()) for p in paths]
    turns = [t for r in runs for t in r["turns"]]
    ok = [t for t in turns if t["ok"]]
    ttft = [t["ttft_s"] * 1000 for t in ok if t["ttft_s"] is not None]
    later = [t["ttft_s"] * 1000 for t in ok if t["ttft_s"] is not None and t["index"] > 0]
    cpu = sum(r["proxy_cpu_s"] for r in runs)
    return {
        "runs": len(runs),
        "requests": len(turns),
        "failed": len(turns) - len(ok),
        "skipped": sum(r["skipped"] for r in runs),
        "ttft_p50_ms": pct(ttft, 50),
        "ttft_p90_ms": pct(ttft, 90),
        "later_turns_ttft_p50_ms": pct(later, 50),
        "later_turns_ttft_p90_ms": pct(later, 90),
        "proxy_cpu_ms_per_request": 1000 * cpu / len(turns) if turns else None,
        "wall_s": sum(r["wall_s"] for r in runs),
        "load": [(r["load_before"][0], r["load_after"][0]) for r in runs],
        "errors": sorted({t["error"] for t in turns if not t["ok"]})[:3],
    }


def report(args: argparse.Namespace, sums: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"threads {args.threads} x turns {args.turns}, concurrency {args.concurrency}, "
        f"{args.engines} engines at speed {args.speed}, policy {args.policy}, "
        f"max_output_tokens {args.tokens}, opening {args.opening_words} words, seed {args.seed}",
        "",
        "| way | runs | requests | failed | TTFT p50 | TTFT p90 | turns 2+ p50 | turns 2+ p90 "
        "| proxy CPU / request | seconds | 1-min load before/after each run |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for way, s in sums.items():
        load = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in s["load"])
        lines.append(
            f"| {way} | {s['runs']} | {s['requests']} | {s['failed']} | "
            f"{fmt(s['ttft_p50_ms'])} ms | {fmt(s['ttft_p90_ms'])} ms | "
            f"{fmt(s['later_turns_ttft_p50_ms'])} ms | {fmt(s['later_turns_ttft_p90_ms'])} ms | "
            f"{fmt(s['proxy_cpu_ms_per_request'], 2)} ms | {fmt(s['wall_s'])} | {load} |"
        )
    for way, s in sums.items():
        if s["errors"] or s["skipped"]:
            lines.append(f"\n{way}: {s['skipped']} turns skipped; errors: {s['errors']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--threads", type=int, default=8)
    p.add_argument("--turns", type=int, default=4, help="turns of each thread")
    p.add_argument("--concurrency", type=int, default=4, help="threads running at once")
    p.add_argument("--repeat", type=int, default=2, help="runs of each way, alternated")
    p.add_argument("--tokens", type=int, default=32, help="max_output_tokens of each turn")
    p.add_argument("--opening-words", type=int, default=300, help="words of a thread's opening")
    p.add_argument("--engines", type=int, default=2)
    p.add_argument("--speed", type=float, default=1.0, help="the simulated engines' clock speed")
    p.add_argument("--policy", default="prefix_aware")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--deadline", type=float, default=120.0, help="seconds for a run's requests")
    p.add_argument("--request-timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    out = REPO / "runs" / time.strftime("responses-%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    try:
        paths = run_alternating(WAYS, args.repeat, lambda way, k: one_run(args, out, way, k))
    except ChildExited as e:  # its ports taken between free_ports and its start, say
        raise SystemExit(f"bench_responses.py: {e}") from None
    sums = {way: summary(ps) for way, ps in paths.items() if ps}
    text = report(args, sums)
    (out / "report.md").write_text(text)
    (out / "report.json").write_bytes(
        orjson.dumps({"args": vars(args), "summary": sums}, option=orjson.OPT_INDENT_2)
    )
    print(text)
    print(f"artifacts: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
