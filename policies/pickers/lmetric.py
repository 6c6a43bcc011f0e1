"""LMetric: score = P_tokens x BS, lowest wins.

- P_tokens = the backend's pending prefill tokens (proxy accounting) + this request's
  uncached tokens there (prefix index): implicit soft affinity, since a backend holding the
  prefix has less to prefill;
- BS = running + waiting requests (`policies.loads.batch_size`: the proxy's in-flight count
  reconciled with the scraped running + waiting, the larger wins).

The product is 0 whenever BS is 0, so ties are common; they are broken deterministically by
fewer uncached tokens (prefer cache), then fewer requests (prefer idle), then a rotating
start index (so cold sessions spread instead of all landing on the first backend).
"""

from __future__ import annotations

from collections.abc import Sequence

from fleet.types import Backend
from policies.framework import PluginBase, RoutingServices, SchedulingRequest
from policies.loads import batch_size, pending_prefill_tokens
from policies.pickers.rotation import Rotation


def lmetric_argmin(req: SchedulingRequest, candidates: Sequence[Backend], start: int) -> Backend:
    """The LMetric choice among non-empty `candidates`, ties going to the first from `start`.

    The key is (P_tokens x BS, uncached tokens, BS), compared lexicographically; written out
    so that a candidate beaten on the product costs no tuple: this loop is most of a
    decision at 64+ backends."""
    best = candidates[0]
    best_score = best_uncached = best_bs = -1.0
    explain = req.explain
    uncached_at = req.uncached_by_backend()
    all_uncached = req.ctx.prompt_tokens
    rotated = [*candidates[start:], *candidates[:start]] if start else candidates
    for b in rotated:
        uncached = uncached_at.get(b.spec.id, all_uncached)
        bs = batch_size(b)
        p_tokens = pending_prefill_tokens(b) + uncached
        score = p_tokens * bs
        if explain:
            req.note(b.id, "p_tokens", p_tokens)
            req.note(b.id, "bs", bs)
            req.note(b.id, "lmetric", score)
            req.note(b.id, "uncached_tokens", uncached)
        if best_score >= 0.0:
            if score > best_score:
                continue
            if score == best_score and (
                uncached > best_uncached or (uncached == best_uncached and bs >= best_bs)
            ):
                continue
        best, best_score, best_uncached, best_bs = b, score, uncached, bs
    return best


class LMetricPicker(PluginBase):
    type = "lmetric-picker"

    def __init__(self, services: RoutingServices, name: str = "") -> None:
        super().__init__(name)
        services.use_prefix_index()
        self._rotation = Rotation()

    def pick(
        self, req: SchedulingRequest, candidates: Sequence[Backend], totals: Sequence[float]
    ) -> Backend:
        req.reasons.append("lmetric")
        return lmetric_argmin(req, candidates, self._rotation.start(len(candidates)))
