"""The floor under a replay's time to first token: what no router can beat on a simulated fleet.

For each request of a multi-turn replay, the floor is its time to first token on an engine
that is idle when it arrives and holds the whole of its conversation's previous prompt in its
prefix cache (whole blocks of it, as vLLM's prefix cache keeps them):

    floor = request_overhead + the steps that compute its uncached tokens alone,
    uncached = prompt - (previous turn's prompt, rounded down to a whole block)

each step timed by the engine profile's step model (`StepTime.duration`) with the prompt cut
into chunks of at most `max_num_batched_tokens`, and the sum divided by the simulator's clock
speed (at speed 0.25 every engine second lasts four wall seconds). A first turn holds nothing.

What it leaves out, each of which only adds to a real request's time: the step already running
when the request arrives (the engine schedules at step boundaries), other prompts computed in
the same steps, the decodes batched with it, the router's and HTTP's own latency, and any
reply text the engine generated that the next turn resends (the replay's default history
resends the recorded reply, which the engine never computed). So the percentiles of the
floors bound a router's percentiles from below on the same replay, and a router's distance
above them is what its routing (and its latency) cost.

The bound holds where conversations share no prefix with each other, as ShareGPT's do not;
with a system prompt shared across sessions (the synthetic chat workload) a first turn finds
part of its prompt cached and may beat this floor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from simulator.profiles import Profile


@dataclass(frozen=True, slots=True)
class FloorRequest:
    session: str
    turn: int
    prompt_tokens: int


def floor_seconds(profile: Profile, prompt_tokens: int, cached_tokens: int) -> float:
    """Engine seconds to the first token of a prompt on an idle engine holding
    `cached_tokens` of it: the API server's overhead and the prefill steps, chunked."""
    st = profile.step_time
    left = max(1, prompt_tokens - cached_tokens)
    done = max(0, min(cached_tokens, prompt_tokens - 1))
    total = profile.request_overhead_s
    while left > 0:
        n = min(left, profile.max_num_batched_tokens)
        total += st.duration(n, done, n * (done + n / 2))
        done += n
        left -= n
    return total


def replay_floors(profile: Profile, speed: float, requests: Sequence[FloorRequest]) -> list[float]:
    """Wall seconds of each request's floor, in the order given (see the module's text)."""
    if speed <= 0:
        raise ValueError("speed must be positive")
    prompts: dict[str, dict[int, int]] = {}
    for r in requests:
        prompts.setdefault(r.session, {}).setdefault(r.turn, r.prompt_tokens)
    block = profile.block_size
    out = []
    for r in requests:
        # The latest earlier turn served (the one before, unless it failed).
        earlier = [t for t in prompts[r.session] if t < r.turn]
        previous = prompts[r.session][max(earlier)] if earlier else 0
        cached = previous // block * block
        out.append(floor_seconds(profile, r.prompt_tokens, cached) / speed)
    return out


def requests_of(rows: Iterable[Mapping[str, Any]]) -> list[FloorRequest]:
    """The served main calls of a run's `metrics.jsonl` rows (the call that carries a turn;
    parallel calls of a turn do not enter its history), with their reported prompt tokens."""
    out = []
    for row in rows:
        if row.get("status") != 200 or row.get("call", 0) != 0:
            continue
        tokens = row.get("prompt_tokens")
        if not isinstance(tokens, int) or tokens <= 0:
            continue
        out.append(FloorRequest(str(row["session_id"]), int(row["turn"]), tokens))
    return out
