"""CPU per routing decision (`policy.pick`) for the prompt the proxy benchmarks send.

Two idle backends, as behind scripts/perf/profile_hot_path.py and bench_proxy_overhead.py,
and the same prompt every time (their `--prompt-chars N`: a prefix-aware policy hashes,
matches and records one block per 64 characters). Each run times `--decisions` picks in this
thread's CPU time, which moves less than wall time on a shared machine; prints the least
and the median of `--runs` runs per policy and prompt length.

    python scripts/perf/bench_long_prompt_decision.py [--policies round_robin,unified]
        [--prompt-chars 28,1000]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from prometheus_client import CollectorRegistry

from fleet.types import Backend, BackendSpec, EngineMetrics, Load, MetricsSnapshot
from policies.policy import RequestContext
from policies.registry import build_policy

MODEL = "fake-model"
SENTENCE = "Say something about routers."


def prompt_of(chars: int) -> str:
    """The sentence, or it repeated to `chars` characters (as bench_proxy_overhead.py does)."""
    if chars <= len(SENTENCE):
        return SENTENCE
    return (f"{SENTENCE} " * (chars // len(SENTENCE) + 1))[:chars]


def idle_backends() -> list[Backend]:
    out = []
    for i in range(2):
        spec = BackendSpec(id=f"b{i}", url=f"http://b{i}:8000", models=(MODEL,))
        scraped = EngineMetrics(block_size=16, num_gpu_blocks=20_000)
        out.append(
            Backend(spec=spec, load=Load(), snapshot=MetricsSnapshot(taken_at=0.0, metrics=scraped))
        )
    return out


def run(policy_name: str, text: str, decisions: int, runs: int) -> list[float]:
    """CPU us per decision of each run, after a warm-up that fills the prefix index."""
    policy = build_policy(policy_name)
    policy.bind_metrics(CollectorRegistry(), dict)  # with its metrics on, as in the proxy
    fleet = idle_backends()
    ctx = RequestContext(
        request_id="bench",
        endpoint="completions",
        model=MODEL,
        body={},
        headers={},
        stream=False,
        prompt_text=text,
        prompt_tokens=len(text) // 4,
    )
    for _ in range(1000):
        policy.pick(ctx, fleet, 0.0)
    out = []
    for _ in range(runs):
        gc.collect()
        gc.disable()
        try:
            t0 = time.thread_time_ns()
            for _ in range(decisions):
                policy.pick(ctx, fleet, 0.0)
            out.append((time.thread_time_ns() - t0) / decisions / 1000)
        finally:
            gc.enable()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--policies", default="round_robin,unified")
    p.add_argument("--prompt-chars", default="28,1000", help="comma-separated prompt lengths")
    p.add_argument("--decisions", type=int, default=20_000)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    for name in args.policies.split(","):
        for chars in (int(c) for c in args.prompt_chars.split(",")):
            text = prompt_of(chars)
            us = run(name, text, args.decisions, args.runs)
            print(
                f"{name:12s} {len(text):6d} chars: least {min(us):6.2f} us, "
                f"median {statistics.median(us):6.2f} us CPU per decision"
            )


if __name__ == "__main__":
    main()
