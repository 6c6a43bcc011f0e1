"""Which of a source instance's requests a migration takes: an order, then a rule.

Only `movable` requests are ever chosen.

Orders (ties broken by request key, so the choice is deterministic):
- LCR: running requests, last arrived first;
- FCR: running requests, first arrived first;
- LR: running requests, longest sequence (`tokens`) first;
- SR: running requests, shortest sequence first;
- FCW: waiting requests (running=False), first arrived first;
- FCWSR: FCW when any waiting request qualifies, else SR.

Rules, applied to the ordered candidates:
- NUM_REQ: the first floor(value) of them;
- TOKEN: the longest prefix whose `tokens` sum stays <= value. The first candidate is taken
  even when it alone exceeds value, else a request longer than the budget could never move.
  The prefix stops at the first request that does not fit (no skipping ahead to a smaller
  one), so the order keeps its meaning: LR really moves the longest requests.
- RATIO: TOKEN with the budget value * the source's KV capacity in tokens; when the capacity
  is unknown, value * the tokens of all the source's requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rescheduler.config import SelectOrder, SelectRule
from rescheduler.view import InstanceView, RequestView


def _running(requests: Iterable[RequestView]) -> list[RequestView]:
    return [r for r in requests if r.movable and r.running]


def _waiting(requests: Iterable[RequestView]) -> list[RequestView]:
    return [r for r in requests if r.movable and not r.running]


def order_requests(requests: Sequence[RequestView], order: SelectOrder) -> list[RequestView]:
    """The movable requests `order` picks from, most wanted first."""
    if order is SelectOrder.LCR:
        # Newest first; among equal arrival times the key still decides, ascending.
        by_key = sorted(_running(requests), key=lambda r: r.key)
        return sorted(by_key, key=lambda r: r.arrived_at, reverse=True)
    if order is SelectOrder.FCR:
        return sorted(_running(requests), key=lambda r: (r.arrived_at, r.key))
    if order is SelectOrder.LR:
        return sorted(_running(requests), key=lambda r: (-r.tokens, r.key))
    if order is SelectOrder.SR:
        return sorted(_running(requests), key=lambda r: (r.tokens, r.key))
    if order is SelectOrder.FCW:
        return sorted(_waiting(requests), key=lambda r: (r.arrived_at, r.key))
    # FCWSR
    waiting = order_requests(requests, SelectOrder.FCW)
    return waiting if waiting else order_requests(requests, SelectOrder.SR)


def take_within_budget(ordered: Sequence[RequestView], budget: float) -> list[RequestView]:
    """The longest prefix of `ordered` holding <= budget tokens, but at least one request."""
    taken: list[RequestView] = []
    total = 0
    for request in ordered:
        if taken and total + request.tokens > budget:
            break
        taken.append(request)
        total += request.tokens
    return taken


def select_requests(
    source: InstanceView,
    rule: SelectRule,
    order: SelectOrder,
    value: float,
    requests: Sequence[RequestView] | None = None,
) -> tuple[str, ...]:
    """Keys of the requests to move off `source` (from `requests`, default all of its own)."""
    candidates = order_requests(source.requests if requests is None else requests, order)
    if rule is SelectRule.NUM_REQ:
        chosen = candidates[: max(0, int(value))]
    elif rule is SelectRule.TOKEN:
        chosen = take_within_budget(candidates, value)
    else:
        capacity = source.capacity_tokens
        if capacity is None:
            capacity = sum(r.tokens for r in source.requests)
        chosen = take_within_budget(candidates, value * capacity)
    return tuple(r.key for r in chosen)
