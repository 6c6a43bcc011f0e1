"""Write a synthetic trace in Mooncake's JSONL format, for trying the trace path offline.

Shaped like Mooncake's conversation trace: conversations arrive as a Poisson process; each
turn resends the whole conversation so far (its hash ids are the previous turn's ids plus new
blocks), all conversations open with a shared system-prompt block run, and turns are spaced
by a think time. Block ids are unique except where sharing is meant.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import orjson

from bench.arrivals import poisson_offsets
from bench.mooncake import MOONCAKE_BLOCK_TOKENS


def conversation_trace(
    *,
    conversations: int,
    turns: tuple[int, int] = (2, 6),
    system_blocks: int = 2,
    user_tokens: tuple[int, int] = (200, 1500),
    output_tokens: tuple[int, int] = (50, 400),
    rate: float = 1.0,
    think_time_s: tuple[float, float] = (2.0, 20.0),
    seed: int = 0,
) -> list[dict[str, object]]:
    """Trace lines sorted by timestamp (ms)."""
    rng = random.Random(seed)
    next_id = system_blocks  # ids 0..system_blocks-1 are the shared system prompt
    lines: list[dict[str, object]] = []
    for start in poisson_offsets(conversations, rate, seed):
        t = start
        context_tokens = system_blocks * MOONCAKE_BLOCK_TOKENS
        ids = list(range(system_blocks))
        for turn in range(rng.randint(*turns)):
            if turn:
                t += rng.uniform(*think_time_s)
            context_tokens += rng.randint(*user_tokens)
            n_out = rng.randint(*output_tokens)
            # Blocks already in `ids` are shared with the previous turn; the rest are new.
            full = math.ceil(context_tokens / MOONCAKE_BLOCK_TOKENS)
            while len(ids) < full:
                ids.append(next_id)
                next_id += 1
            lines.append(
                {
                    "timestamp": round(t * 1000),
                    "input_length": context_tokens,
                    "output_length": n_out,
                    "hash_ids": list(ids),
                }
            )
            # The reply joins the context. A partial last block keeps its id: the next turn's
            # text of that block extends this turn's (bench synthesizes block text as a
            # prefix-stable stream), so the whole prompt is shared, as in a real chat.
            context_tokens += n_out
    lines.sort(key=lambda x: x["timestamp"])  # type: ignore[arg-type,return-value]
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleet-proxy bench make-trace",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
    )
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--conversations", type=int, default=50)
    p.add_argument("--rate", type=float, default=1.0, help="conversations per second")
    p.add_argument("--system-blocks", type=int, default=2, help="shared 512-token blocks")
    p.add_argument("--seed", type=int, default=0)
    return p


def make_trace_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    lines = conversation_trace(
        conversations=args.conversations,
        rate=args.rate,
        system_blocks=args.system_blocks,
        seed=args.seed,
    )
    args.out.write_bytes(b"".join(orjson.dumps(x) + b"\n" for x in lines))
    print(f"{len(lines)} requests from {args.conversations} conversations -> {args.out}")
    return 0
