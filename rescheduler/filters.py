"""Which instances a policy may consider: single-instance filters and the failover domain.

Single-instance filters look at one instance at a time:
- infer type: a policy works on one kind of worker (decode, neutral or prefill);
- fresh: its metrics were scraped, and at most `instance_staleness_s` ago
  (now - scraped_at <= instance_staleness_s); a stale or never-scraped instance's numbers
  cannot be trusted for balancing and it may be gone;
- healthy: schedulable and fresh, the only kind that may give or take requests in a
  balancing move;
- needs failover: not schedulable, or stale; its requests should leave it.

The failover domain is a global filter: given the failed instances, it names every instance
that shares their fate and so must not receive their requests.
- `instance`: only the failed instances;
- `node`: every instance on the same node as a failed one;
- `instance-unit`: every instance in the same unit as a failed one;
- `node-unit`: every instance on a failed node, and every instance sharing a unit with any
  of them (the node's whole units go down with it).
An empty node or unit string means "unknown": it groups the instance with nobody.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rescheduler.config import FailoverDomain
from rescheduler.view import InferType, InstanceView


def is_fresh(instance: InstanceView, now: float, staleness_s: float) -> bool:
    return instance.scraped_at is not None and now - instance.scraped_at <= staleness_s


def is_healthy(instance: InstanceView, now: float, staleness_s: float) -> bool:
    return instance.schedulable and is_fresh(instance, now, staleness_s)


def needs_failover(instance: InstanceView, now: float, staleness_s: float) -> bool:
    return not is_healthy(instance, now, staleness_s)


def of_types(instances: Iterable[InstanceView], types: Iterable[InferType]) -> list[InstanceView]:
    """The instances of the given infer types, sorted by id (every later step relies on it)."""
    wanted = frozenset(types)
    return sorted((i for i in instances if i.infer_type in wanted), key=lambda i: i.id)


def _same(value: str, values: frozenset[str]) -> bool:
    return value != "" and value in values


def failure_domain(
    failed: Sequence[InstanceView], fleet: Sequence[InstanceView], domain: FailoverDomain
) -> frozenset[str]:
    """Ids of the instances in `fleet` that share a failure domain with any of `failed`.

    The failed instances themselves are always in it. `fleet` should be every instance in
    the view, of any infer type: a node or unit is shared across types.
    """
    excluded = {i.id for i in failed}
    nodes = frozenset(i.node for i in failed if i.node)
    if domain is FailoverDomain.INSTANCE:
        return frozenset(excluded)
    if domain is FailoverDomain.NODE:
        excluded.update(i.id for i in fleet if _same(i.node, nodes))
        return frozenset(excluded)
    if domain is FailoverDomain.INSTANCE_UNIT:
        units = frozenset(i.unit for i in failed if i.unit)
        excluded.update(i.id for i in fleet if _same(i.unit, units))
        return frozenset(excluded)
    # NODE_UNIT: the failed instances and their node mates, then all of their units.
    on_node = [i for i in fleet if _same(i.node, nodes)]
    excluded.update(i.id for i in on_node)
    units = frozenset(i.unit for i in (*failed, *on_node) if i.unit)
    excluded.update(i.id for i in fleet if _same(i.unit, units))
    return frozenset(excluded)
