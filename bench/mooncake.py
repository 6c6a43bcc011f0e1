"""Mooncake-format traces: one JSON object per line,
`{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}`.

Each hash id names a 512-token block; requests that share leading hash ids share that
prefix. Prompts are synthesized block by block from `BlockText`, so equal ids give equal text
and the trace's prefix sharing is reproduced exactly.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import orjson

from bench.textgen import BlockText
from bench.workload import Session, Turn, Workload

MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class TraceEntry:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def parse_trace(lines: Iterable[str | bytes]) -> list[TraceEntry]:
    """Parse trace lines, skipping blank ones; errors name the line number."""
    entries: list[TraceEntry] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
            entry = TraceEntry(
                timestamp_ms=float(obj.get("timestamp", 0)),
                input_length=int(obj["input_length"]),
                output_length=int(obj["output_length"]),
                hash_ids=tuple(int(h) for h in obj.get("hash_ids", ())),
            )
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise TraceError(f"trace line {number}: {e}") from e
        if entry.input_length < 1 or entry.output_length < 1:
            raise TraceError(f"trace line {number}: lengths must be positive")
        entries.append(entry)
    return entries


def read_trace(path: str) -> list[TraceEntry]:
    with open(path, "rb") as f:
        return parse_trace(f)


def build_workload(
    entries: list[TraceEntry],
    *,
    salt: str = "",
    speed: float = 1.0,
    max_requests: int | None = None,
    max_input_tokens: int | None = None,
    max_output_tokens: int | None = None,
) -> Workload:
    """One single-turn session per trace line, arriving at its timestamp / `speed`.

    Capping the input keeps the prompt's leading blocks, so sharing among the kept part is
    unchanged; the cap exists for engines with a short context.
    """
    if speed <= 0:
        raise ValueError("speed must be positive")
    chosen = entries[:max_requests] if max_requests is not None else entries
    blocks = BlockText(MOONCAKE_BLOCK_TOKENS, salt=f"mooncake{salt}")
    t0 = min((e.timestamp_ms for e in chosen), default=0.0)
    sessions = []
    for i, e in enumerate(chosen):
        n_in = min(e.input_length, max_input_tokens) if max_input_tokens else e.input_length
        n_out = min(e.output_length, max_output_tokens) if max_output_tokens else e.output_length
        # A line without hash ids shares nothing: give it an id no trace uses.
        prompt = blocks.prompt(list(e.hash_ids) or [-1 - i], n_in)
        sessions.append(
            Session(
                id=f"mc-{i}",
                turns=(Turn(user=prompt, max_tokens=n_out),),
                arrival_s=(e.timestamp_ms - t0) / 1000.0 / speed,
            )
        )
    return Workload(
        name="mooncake",
        sessions=tuple(sessions),
        params={
            "requests": len(sessions),
            "speed": speed,
            "max_input_tokens": max_input_tokens,
            "max_output_tokens": max_output_tokens,
            "block_tokens": MOONCAKE_BLOCK_TOKENS,
        },
    )
