"""Synthetic workloads: multi-turn chat sessions and agent programs.

Both are pure functions of their parameters and a seed, so A and B runs replay the same
sessions. Lengths are in tokens (4 characters each, see textgen).
"""

from __future__ import annotations

import random

from bench.textgen import filler
from bench.workload import Session, Turn, Workload

PROGRAM_HEADER = "x-program-id"
# Chat clients name their conversation so a session-aware router (unified's affinity gate,
# session-affinity scorer) can find its owner.
SESSION_HEADER = "x-session-id"


def chat_sessions(
    *,
    sessions: int,
    turns: tuple[int, int] = (3, 6),
    system_tokens: int = 256,
    user_tokens: tuple[int, int] = (64, 256),
    output_tokens: tuple[int, int] = (32, 128),
    think_time_s: float = 0.0,
    seed: int = 0,
    salt: str = "",
) -> Workload:
    """Chats that all start from one shared system prompt and grow turn by turn.

    Ranges are inclusive (lo, hi) and drawn uniformly per session / per turn.
    """
    rng = random.Random(seed)
    system = filler(f"{salt}/chat/system", system_tokens)
    out: list[Session] = []
    for s in range(sessions):
        n_turns = rng.randint(*turns)
        session_turns = []
        for t in range(n_turns):
            n_user = rng.randint(*user_tokens)
            n_out = rng.randint(*output_tokens)
            session_turns.append(
                Turn(
                    user=filler(f"{salt}/chat/{seed}/{s}/{t}/user", n_user),
                    max_tokens=n_out,
                    reply=filler(f"{salt}/chat/{seed}/{s}/{t}/reply", n_out),
                )
            )
        out.append(
            Session(
                id=f"chat-{s}",
                turns=tuple(session_turns),
                system=system,
                think_time_s=think_time_s,
                headers={SESSION_HEADER: f"chat-{seed}-{s}{salt}"},
            )
        )
    return Workload(
        name="chat",
        sessions=tuple(out),
        params={
            "sessions": sessions,
            "turns": list(turns),
            "system_tokens": system_tokens,
            "user_tokens": list(user_tokens),
            "output_tokens": list(output_tokens),
            "think_time_s": think_time_s,
            "seed": seed,
        },
    )


def agent_programs(
    *,
    programs: int,
    calls: tuple[int, int] = (4, 8),
    context_tokens: int = 2048,
    observation_tokens: tuple[int, int] = (32, 192),
    output_tokens: tuple[int, int] = (16, 96),
    fanout: int = 1,
    think_time_s: float = 0.0,
    seed: int = 0,
    salt: str = "",
) -> Workload:
    """Agent programs: many calls per program over a long program-specific context.

    Each step sends a tool observation as the user message and `fanout - 1` sibling calls
    over the same context (parallel tool use); the main call's reply enters the history.
    Every call carries the `x-program-id` header so a program-aware router can group them.
    """
    if fanout < 1:
        raise ValueError("fanout must be >= 1")
    rng = random.Random(seed)
    out: list[Session] = []
    for p in range(programs):
        system = filler(f"{salt}/agent/{seed}/{p}/context", context_tokens)
        steps = []
        for c in range(rng.randint(*calls)):
            n_obs = rng.randint(*observation_tokens)
            n_out = rng.randint(*output_tokens)
            base = f"{salt}/agent/{seed}/{p}/{c}"
            steps.append(
                Turn(
                    user=filler(f"{base}/obs", n_obs),
                    max_tokens=n_out,
                    reply=filler(f"{base}/reply", n_out),
                    parallel=tuple(filler(f"{base}/branch{b}", n_obs) for b in range(1, fanout)),
                )
            )
        out.append(
            Session(
                id=f"prog-{p}",
                turns=tuple(steps),
                system=system,
                think_time_s=think_time_s,
                headers={PROGRAM_HEADER: f"prog-{seed}-{p}{salt}"},
            )
        )
    return Workload(
        name="agent",
        sessions=tuple(out),
        params={
            "programs": programs,
            "calls": list(calls),
            "context_tokens": context_tokens,
            "observation_tokens": list(observation_tokens),
            "output_tokens": list(output_tokens),
            "fanout": fanout,
            "think_time_s": think_time_s,
            "seed": seed,
        },
    )
