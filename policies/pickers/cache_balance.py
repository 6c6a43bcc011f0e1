"""Cache-balance: the hybrid's owner gate, cold requests to the engine caching least, a
switch to the shortest queue when loads drift apart, and a guard on the request spread.

For every request, over the candidates (BS = `policies.loads.batch_size`):
1. Spread guard. The picker remembers its last `spread_window` choices. Once it holds
   `spread_warmup` of them, a candidate chosen more than `spread_factor` x the mean count is
   left out of this decision (the candidate chosen least is never above the mean, so one
   always remains).
2. Load switch. Among those left, when max BS - min BS > `balance_abs_threshold` AND
   max BS > `balance_rel_threshold` x min BS, the request goes to the least BS (ties: fewer
   uncached tokens, then rotation): the cache no longer decides while loads are apart.
3. Owner gate. The owner is the candidate holding the longest cached prefix of the prompt
   (ties: lower BS, then rotation). Its cache ratio is the share of the prompt's tokens it
   holds. It takes the request when ratio > `cache_ratio_threshold` and
   BS(owner) <= average BS x `overload_factor`; an overloaded owner leaves the request to
   LMetric (argmin P_tokens x BS) over the candidates with BS <= average x `ceiling_factor`,
   the hybrid's tail behaviour.
4. Cold placement. No owner above the threshold: the candidate holding the fewest cached
   blocks in the prefix index (most room, and nothing there a turn would miss), among those
   with BS <= average x `ceiling_factor`; ties: lower BS, then rotation.

The decision is `decide`, a pure function of each candidate's figures; the picker reads them
from the backends and the prefix index and keeps the window. No clock: the window counts
decisions, not seconds, so it means the same at any request rate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from fleet.prefix import PrefixIndex
from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.loads import batch_size, pending_prefill_tokens, running_size
from policies.pickers.rotation import Rotation, rotated
from policies.pickers.spread_window import SpreadWindow

Rule = Literal["imbalance", "owner", "lmetric", "cold"]


class CacheBalanceParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    cache_ratio_threshold: float = Field(0.3, ge=0.0, le=1.0)
    overload_factor: float = Field(2.0, gt=0.0)
    ceiling_factor: float = Field(2.0, gt=0.0)
    balance_abs_threshold: float = Field(8.0, ge=0.0)
    balance_rel_threshold: float = Field(1.5, ge=1.0)
    spread_factor: float = Field(1.3, ge=1.0)
    spread_window: int = Field(256, ge=1)
    spread_warmup: int = Field(32, ge=1)


@dataclass(frozen=True, slots=True)
class View:
    """What the decision reads of one candidate."""

    bs: float  # running + waiting requests
    cached: int  # the prompt's leading tokens it holds
    pending: float  # prefill tokens it has yet to do
    blocks: int  # cached blocks the prefix index holds for it (its footprint)
    recent: int  # times chosen in the current window
    decoding: float = 0.0  # running requests (`policies.loads.running_size`)


@dataclass(frozen=True, slots=True)
class Decision:
    index: int
    rule: Rule


def decide(
    views: Sequence[View], prompt_tokens: int, p: CacheBalanceParams, guard: bool, start: int
) -> Decision:
    """The candidate for a request (index into `views`, non-empty); ties go to the first
    in rotation order from `start`."""
    n = len(views)
    pool = list(range(n))
    if guard:
        mean = sum(v.recent for v in views) / n
        pool = [i for i in pool if views[i].recent <= mean * p.spread_factor]
    pool = rotated(pool, start)  # min() keeps the first of equals: rotation breaks ties
    bss = [views[i].bs for i in pool]
    lo, hi = min(bss), max(bss)
    if hi - lo > p.balance_abs_threshold and hi > p.balance_rel_threshold * lo:
        i = min(pool, key=lambda j: (views[j].bs, -views[j].cached))
        return Decision(i, "imbalance")
    avg = sum(bss) / len(pool)
    owner = min(pool, key=lambda j: (-views[j].cached, views[j].bs))
    cached = views[owner].cached
    if prompt_tokens > 0 and cached > 0 and cached / prompt_tokens > p.cache_ratio_threshold:
        if views[owner].bs <= avg * p.overload_factor:
            return Decision(owner, "owner")
        under = [i for i in pool if views[i].bs <= avg * p.ceiling_factor] or pool

        def lmetric(j: int) -> tuple[float, int, float]:
            v = views[j]
            uncached = prompt_tokens - v.cached
            return ((v.pending + uncached) * v.bs, uncached, v.bs)

        return Decision(min(under, key=lmetric), "lmetric")
    under = [i for i in pool if views[i].bs <= avg * p.ceiling_factor] or pool
    return Decision(min(under, key=lambda j: (views[j].blocks, views[j].bs)), "cold")


def views_of(
    req: SchedulingRequest, candidates: Sequence[Backend], index: PrefixIndex, window: SpreadWindow
) -> list[View]:
    """What a decision reads of each candidate: its load, this prompt's tokens it holds (the
    precise index where it stands for the backend, else `index`), its footprint in `index`
    and its count in `window`."""
    tokens = req.ctx.prompt_tokens
    uncached_at = req.uncached_by_backend()
    return [
        View(
            bs=batch_size(b),
            cached=tokens - uncached_at.get(b.spec.id, tokens),
            pending=pending_prefill_tokens(b),
            blocks=index.backend_blocks(b.spec.id),
            recent=window.recent(b.spec.id),
            decoding=running_size(b),
        )
        for b in candidates
    ]


class CacheBalancePicker(PluginBase):
    type = "cache-balance-picker"

    def __init__(
        self, params: CacheBalanceParams, services: RoutingServices, name: str = ""
    ) -> None:
        super().__init__(name)
        self._index = services.use_prefix_index()
        self.params = params
        self._rotation = Rotation()
        self._window = SpreadWindow(params.spread_window)
        self.rules: dict[str, int] = {"imbalance": 0, "owner": 0, "lmetric": 0, "cold": 0}
        self.spread_exclusions = 0

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        tokens = req.ctx.prompt_tokens
        views = views_of(req, candidates, self._index, self._window)
        guard = self._window.warm(self.params.spread_warmup)
        d = decide(views, tokens, self.params, guard, self._rotation.start(len(candidates)))
        if guard:
            mean = sum(v.recent for v in views) / len(views)
            if any(v.recent > mean * self.params.spread_factor for v in views):
                self.spread_exclusions += 1
        self.rules[d.rule] += 1
        chosen = candidates[d.index]
        self._window.remember(chosen.spec.id)
        if req.explain:
            for b, v in zip(candidates, views, strict=True):
                req.note(b.id, "bs", v.bs)
                req.note(b.id, "cached_tokens", v.cached)
                req.note(b.id, "index_blocks", v.blocks)
                req.note(b.id, "recent_picks", v.recent)
        req.reasons.append(f"cache_balance: {d.rule}")
        return chosen

    def stats(self) -> dict[str, int]:
        return {**self.rules, "spread_exclusions": self.spread_exclusions}
