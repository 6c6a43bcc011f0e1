"""The affinity owner of a session's request: the candidate holding the longest cached prefix
of its prompt.

The cached share is read from `SchedulingRequest.uncached_by_backend`: by the engines' own
KV-cache events for every backend the precise index stands for (the same in every worker and
every replica, since all follow the same events), by this process's approximate index for the
rest. So the owner is state every process shares or derives, with no per-process table of
where sessions went.

Ties (a shared system prompt cached on several engines) go to the less loaded (BS), then to
the higher rendezvous weight of the session id (policies/rendezvous.py), then to the smaller
id: the same answer in every process for the same fleet state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from fleet.types import Backend
from policies.framework import SchedulingRequest
from policies.loads import batch_size
from policies.rendezvous import key_seed, weight


@dataclass(frozen=True, slots=True)
class CacheOwner:
    backend: Backend
    cached_tokens: int
    ratio: float  # cached_tokens / the prompt's tokens, in (0, 1]


def cache_owner(
    req: SchedulingRequest, candidates: Sequence[Backend], session_id: str
) -> CacheOwner | None:
    """The candidate holding most of the prompt's leading tokens; None when none holds any."""
    tokens = req.ctx.prompt_tokens
    uncached_at = req.uncached_by_backend()
    if tokens <= 0 or not uncached_at:
        return None
    best: Backend | None = None
    best_cached = best_w = 0
    best_bs = 0.0
    best_id = ""
    seed: int | None = None
    for b in candidates:
        bid = b.spec.id
        uncached = uncached_at.get(bid)
        if uncached is None:
            continue
        cached = tokens - uncached
        if cached <= 0 or cached < best_cached:
            continue
        bs = batch_size(b)
        if seed is None:
            seed = key_seed(session_id)  # only once some backend holds the prompt
        w = weight(seed, bid)
        if (
            best is not None
            and cached == best_cached
            and (bs, -w, bid) > (best_bs, -best_w, best_id)
        ):
            continue
        best, best_cached, best_bs, best_w, best_id = b, cached, bs, w, bid
    if best is None:
        return None
    return CacheOwner(best, best_cached, min(1.0, best_cached / tokens))
