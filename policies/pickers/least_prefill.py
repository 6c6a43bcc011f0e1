"""Least-prefill: the candidate where this request's first token comes soonest, by the prefill
work ahead of it, with the cache deciding through that work rather than through a gate.

An engine computes the prompts it holds before it can answer a new one (vLLM schedules
prefills first come first served within its token budget per step, and a request's first
token leaves at the end of the step that finishes its prompt), so the request's time to its
first token on a candidate grows with the prefill tokens already waiting there plus the
tokens of this prompt the candidate does not hold:

    work(b) = pending(b)
            + uncached(b) x (1 + decode_weight x decoding(b))
            + recompute_weight x (uncached(b) - min uncached)

- pending(b): prompt tokens dispatched to b and not yet past their first token, over every
  worker (`policies.loads.pending_prefill_tokens`);
- uncached(b): this prompt's tokens b does not hold, from the prefix index (the engines'
  KV-cache events where the precise index stands for b, else this process's approximate
  index);
- decoding(b): requests running on b (`policies.loads.running_size`: the proxy's count past
  their first token, or the scraped running count, which includes prefills, if larger).
  Each prefill token computed on b lengthens the step every one of them waits for: with
  weight 1 the product is the delay this choice causes them, beside this request's own wait;
- the last term charges a choice for the prefill it makes the fleet repeat: going past the
  candidate holding most of the prompt computes its cached tokens again, and those steps
  delay every later request there.

Over the candidates with BS <= average BS x `ceiling_factor` (all of them while none is;
BS = running + waiting), the least work wins. Ties (every engine idle, a cold prompt) go to
the candidate with the fewest blocks in the prefix index (the most room, and no other
conversation's history there), then the lower BS, then rotation. With `spread_factor` set,
a candidate chosen more than that times the mean of the last `spread_window` choices sits
the decision out once `spread_warmup` choices are remembered.

What each part answers: a session's next turn goes back to the engine holding its history
(its uncached tokens are few) unless that engine is busy prefilling more than the history
would cost elsewhere; a short request never queues behind another conversation's long
prefill while an engine is free; a cold conversation starts where the least is cached. The
gates of the hybrid (a cache-ratio threshold, an overload factor on request counts) cannot
see a long prefill in progress: one request in flight counts as one, whether it is 30
tokens or 5,000.

The decision is `decide`, a pure function of each candidate's figures (cache_balance's
`View`); the picker reads them from the backends and the prefix index and keeps the window.
Measured against round robin, the hybrid and the peer routers: docs/benchmarks.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.pickers.cache_balance import View, views_of
from policies.pickers.rotation import Rotation, rotated
from policies.pickers.spread_window import SpreadWindow

Rule = Literal["cached", "cold"]


class LeastPrefillParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    recompute_weight: float = Field(1.0, ge=0.0)
    decode_weight: float = Field(1.0, ge=0.0)
    ceiling_factor: float = Field(2.0, gt=0.0)
    spread_factor: float | None = Field(None, ge=1.0)
    spread_window: int = Field(256, ge=1)
    spread_warmup: int = Field(32, ge=1)


def decide(
    views: Sequence[View], prompt_tokens: int, p: LeastPrefillParams, guard: bool, start: int
) -> tuple[int, Rule]:
    """The candidate for a request (index into non-empty `views`) and whether some candidate
    held part of the prompt; ties go to the first in rotation order from `start`."""
    n = len(views)
    pool = list(range(n))
    if guard and p.spread_factor is not None:
        mean = sum(v.recent for v in views) / n
        pool = [i for i in pool if views[i].recent <= mean * p.spread_factor]
    pool = rotated(pool, start)  # min() keeps the first of equals: rotation breaks ties
    avg = sum(views[i].bs for i in pool) / len(pool)
    under = [i for i in pool if views[i].bs <= avg * p.ceiling_factor] or pool
    most_cached = max(views[i].cached for i in under)
    w = p.recompute_weight
    k = p.decode_weight

    def key(i: int) -> tuple[float, int, float]:
        v = views[i]
        uncached = prompt_tokens - v.cached
        work = v.pending + uncached * (1.0 + k * v.decoding) + w * (most_cached - v.cached)
        return (work, v.blocks, v.bs)

    best = min(under, key=key)
    return best, ("cached" if views[best].cached > 0 else "cold")


class LeastPrefillPicker(PluginBase):
    type = "least-prefill-picker"

    def __init__(
        self, params: LeastPrefillParams, services: RoutingServices, name: str = ""
    ) -> None:
        super().__init__(name)
        self._index = services.use_prefix_index()
        self.params = params
        self._rotation = Rotation()
        self._window = SpreadWindow(params.spread_window)
        self.rules: dict[str, int] = {"cached": 0, "cold": 0}

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        p = self.params
        tokens = req.ctx.prompt_tokens
        views = views_of(req, candidates, self._index, self._window)
        guard = p.spread_factor is not None and self._window.warm(p.spread_warmup)
        index, rule = decide(views, tokens, p, guard, self._rotation.start(len(candidates)))
        self.rules[rule] += 1
        chosen = candidates[index]
        if p.spread_factor is not None:
            self._window.remember(chosen.spec.id)
        if req.explain:
            for b, v in zip(candidates, views, strict=True):
                req.note(b.id, "bs", v.bs)
                req.note(b.id, "pending_prefill_tokens", v.pending)
                req.note(b.id, "cached_tokens", v.cached)
                req.note(b.id, "index_blocks", v.blocks)
                req.note(b.id, "decoding", v.decoding)
        req.reasons.append(f"least_prefill: {rule}")
        return chosen

    def stats(self) -> dict[str, int]:
        return dict(self.rules)
