"""The rescheduling policies, each an object that proposes migrations for one cycle.

Every policy follows the same steps, as Llumnix's rescheduler does: compute its metric for
the instances, keep those that pass its single-instance filters (infer type, schedulable,
fresh) and its global filter (failover domain), let a selector pair sources with targets,
and pick the requests each pair moves. What it returns is a proposal: `decide` then
validates it against the pairs earlier policies chose this cycle.

- `decode_load` / `neutral_load`: load balancing among healthy decode (neutral) instances.
  Sources have load >= the threshold, targets load < it; `metric_balance_pairs` pairs them,
  over the whole cluster or within each unit (scope `unit`; an instance with no unit is in
  none and is not balanced). Each pair moves the requests the select rule and order pick.
- `prefill_failover` / `decode_failover` / `neutral_failover`: instances of the type that are
  unschedulable or stale hand every movable request (ignoring the select rule: failover
  empties the instance), oldest first, round-robin to the healthy instances of the type
  outside the failure domain of any failed one.
- `binpacking_mitigation` / `binpacking_consolidation`: adaptive P/D on the running (decode)
  requests of healthy decode and neutral instances not reserved for prefill, judged by the
  predicted TPOT (rescheduler/tpot.py) against slo = tpot_slo_s, at most one pair a cycle.
  Mitigation: sources at TPOT >= ceil * slo, targets under dispatch * slo; the worst source
  sends the requests the select rule and order pick (among running ones) to the target with
  the lowest TPOT. Consolidation: sources under floor * slo with a decode batch, targets
  under dispatch * slo with a decode batch; the least-loaded source moves all its movable
  running requests to the most loaded target still under dispatch * slo with them added.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from rescheduler.config import ReschedulerConfig, Scope, SelectOrder
from rescheduler.filters import failure_domain, is_fresh, is_healthy, needs_failover, of_types
from rescheduler.load import load_metric
from rescheduler.select import select_requests
from rescheduler.selectors import (
    Scored,
    consolidation_pair,
    metric_balance_pairs,
    mitigation_pair,
    round_robin,
)
from rescheduler.tpot import TpotModel, fit_tpot_model, predict_tpot
from rescheduler.view import ClusterView, InferType, InstanceView, Migration, RequestView


@dataclass(frozen=True, slots=True)
class Proposal:
    """What one policy would do this cycle, before validation against earlier policies."""

    sources: tuple[str, ...] = ()
    targets: tuple[str, ...] = ()
    migrations: tuple[Migration, ...] = ()
    note: str = ""  # why nothing moves, when nothing does


class Policy(Protocol):
    @property
    def name(self) -> str: ...

    def propose(self, view: ClusterView, config: ReschedulerConfig, now: float) -> Proposal: ...


def _ids(instances: Sequence[InstanceView]) -> tuple[str, ...]:
    return tuple(i.id for i in instances)


def _num(value: float) -> str:
    return f"{value:g}"


# --- load balancing -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadBalancePolicy:
    name: str
    infer_type: InferType
    metric_name: Callable[[ReschedulerConfig], str]
    threshold: Callable[[ReschedulerConfig], float]

    def propose(self, view: ClusterView, config: ReschedulerConfig, now: float) -> Proposal:
        kind = self.infer_type.value
        healthy = [
            i
            for i in of_types(view.instances, (self.infer_type,))
            if is_healthy(i, now, config.instance_staleness_s)
        ]
        if not healthy:
            return Proposal(note=f"no schedulable, fresh {kind} instance")
        metric_name = self.metric_name(config)
        metric = load_metric(metric_name)
        threshold = self.threshold(config)
        loads = {i.id: metric(i) for i in healthy}
        sources = [i for i in healthy if loads[i.id] >= threshold]
        targets = [i for i in healthy if loads[i.id] < threshold]
        found = Proposal(sources=_ids(sources), targets=_ids(targets))
        if not sources:
            return _with_note(
                found, f"no source at or over threshold {_num(threshold)} ({metric_name})"
            )
        if not targets:
            return _with_note(found, f"no target under threshold {_num(threshold)} ({metric_name})")
        pairs: list[tuple[str, str]] = []
        for group in _balancing_groups(healthy, config.load_balance_scope):
            members = {i.id for i in group}
            pairs += metric_balance_pairs(
                [(i.id, loads[i.id]) for i in sources if i.id in members],
                [(i.id, loads[i.id]) for i in targets if i.id in members],
                config.load_balance_threshold,
            )
        if not pairs:
            within = " within a unit" if config.load_balance_scope is Scope.UNIT else ""
            gap = _num(config.load_balance_threshold)
            return _with_note(found, f"no source-target pair{within} differs by more than {gap}")
        by_id = {i.id: i for i in healthy}
        migrations = []
        for source, target in pairs:
            keys = select_requests(
                by_id[source],
                config.req_select_rule,
                config.req_select_order,
                config.req_select_value,
            )
            if keys:
                migrations.append(Migration(self.name, source, target, keys))
        if not migrations:
            rule = f"{config.req_select_order.value}/{config.req_select_rule.value}"
            return _with_note(found, f"the paired sources have no movable request {rule} picks")
        return Proposal(found.sources, found.targets, tuple(migrations))


def _balancing_groups(healthy: Sequence[InstanceView], scope: Scope) -> list[list[InstanceView]]:
    if scope is Scope.CLUSTER:
        return [list(healthy)]
    units: dict[str, list[InstanceView]] = defaultdict(list)
    for instance in healthy:
        if instance.unit:
            units[instance.unit].append(instance)
    return [units[u] for u in sorted(units)]


def _with_note(proposal: Proposal, note: str) -> Proposal:
    return Proposal(proposal.sources, proposal.targets, proposal.migrations, note)


# --- failover -------------------------------------------------------------------------------


def _oldest_first(requests: Sequence[RequestView]) -> list[str]:
    movable = sorted((r for r in requests if r.movable), key=lambda r: (r.arrived_at, r.key))
    return [r.key for r in movable]


@dataclass(frozen=True, slots=True)
class FailoverPolicy:
    name: str
    infer_type: InferType

    def propose(self, view: ClusterView, config: ReschedulerConfig, now: float) -> Proposal:
        kind = self.infer_type.value
        staleness = config.instance_staleness_s
        of_kind = of_types(view.instances, (self.infer_type,))
        failed = [i for i in of_kind if needs_failover(i, now, staleness)]
        if not failed:
            return Proposal(note=f"no {kind} instance needs failover")
        excluded = failure_domain(failed, view.instances, config.failover_domain)
        targets = [i for i in of_kind if is_healthy(i, now, staleness) and i.id not in excluded]
        found = Proposal(sources=_ids(failed), targets=_ids(targets))
        hands = [(i.id, _oldest_first(i.requests)) for i in failed]
        if not any(keys for _, keys in hands):
            return _with_note(found, "the failed instances hold no movable request")
        if not targets:
            domain = config.failover_domain.value
            return _with_note(
                found, f"no schedulable, fresh {kind} instance outside the {domain} failure domain"
            )
        migrations = tuple(
            Migration(self.name, source, target, keys)
            for source, target, keys in round_robin(hands, _ids(targets))
        )
        return Proposal(found.sources, found.targets, migrations)


# --- binpacking (adaptive P/D) --------------------------------------------------------------

# Binpacking moves running requests only; an order that picks waiting ones stands for its
# running counterpart.
_RUNNING_ORDER = {SelectOrder.FCW: SelectOrder.FCR, SelectOrder.FCWSR: SelectOrder.SR}


@dataclass(frozen=True, slots=True)
class _Packing:
    """The instances binpacking may use, and their predicted TPOTs."""

    instances: Mapping[str, InstanceView]
    model: TpotModel
    tpot: Mapping[str, float]


def _packing(view: ClusterView, config: ReschedulerConfig, now: float) -> _Packing | str:
    """The binpacking fleet, or why there is none."""
    staleness = config.instance_staleness_s
    decoding = of_types(view.instances, (InferType.DECODE, InferType.NEUTRAL))
    # Any fresh measurement describes the model (one model across the fleet), even from an
    # instance binpacking may not use: reserved for prefill, or unschedulable.
    model = fit_tpot_model(i for i in decoding if is_fresh(i, now, staleness))
    usable = [i for i in decoding if not i.prefill_reserved and is_healthy(i, now, staleness)]
    if not usable:
        return "no schedulable, fresh decode or neutral instance outside prefill reserve"
    if model is None:
        return "TPOT unknown: no fresh instance reports an inter-token latency while decoding"
    tpot: dict[str, float] = {}
    for i in usable:
        predicted = predict_tpot(i, model)
        if predicted is not None:
            tpot[i.id] = predicted
    return _Packing({i.id: i for i in usable}, model, tpot)


def _running(instance: InstanceView) -> list[RequestView]:
    return [r for r in instance.requests if r.running and r.movable]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:g} ms"


@dataclass(frozen=True, slots=True)
class BinpackingMitigation:
    name: str = "binpacking_mitigation"

    def propose(self, view: ClusterView, config: ReschedulerConfig, now: float) -> Proposal:
        packing = _packing(view, config, now)
        if isinstance(packing, str):
            return Proposal(note=packing)
        ceil = config.tpot_migrate_out_ceil_threshold * config.tpot_slo_s
        dispatch = config.tpot_dispatch_threshold * config.tpot_slo_s
        sources: list[Scored] = [(i, t) for i, t in packing.tpot.items() if t >= ceil]
        targets: list[Scored] = [(i, t) for i, t in packing.tpot.items() if t < dispatch]
        found = Proposal(
            sources=tuple(sorted(i for i, _ in sources)),
            targets=tuple(sorted(i for i, _ in targets)),
        )
        if not sources:
            return _with_note(found, f"no instance at or over TPOT {_ms(ceil)}")
        if not targets:
            return _with_note(found, f"no instance under TPOT {_ms(dispatch)}")
        order = _RUNNING_ORDER.get(config.req_select_order, config.req_select_order)
        picks = {
            i: select_requests(
                packing.instances[i],
                config.req_select_rule,
                order,
                config.req_select_value,
                _running(packing.instances[i]),
            )
            for i, _ in sources
        }
        pair = mitigation_pair(sources, targets, lambda i: bool(picks[i]))
        if pair is None:
            return _with_note(found, "no source has a movable running request to a target")
        source, target = pair
        return Proposal(
            found.sources, found.targets, (Migration(self.name, source, target, picks[source]),)
        )


@dataclass(frozen=True, slots=True)
class BinpackingConsolidation:
    name: str = "binpacking_consolidation"

    def propose(self, view: ClusterView, config: ReschedulerConfig, now: float) -> Proposal:
        packing = _packing(view, config, now)
        if isinstance(packing, str):
            return Proposal(note=packing)
        floor = config.tpot_migrate_out_floor_threshold * config.tpot_slo_s
        dispatch = config.tpot_dispatch_threshold * config.tpot_slo_s
        decoding = {i: t for i, t in packing.tpot.items() if packing.instances[i].num_running > 0}
        sources: list[Scored] = [(i, t) for i, t in decoding.items() if t < floor]
        targets: list[Scored] = [(i, t) for i, t in decoding.items() if t < dispatch]
        found = Proposal(
            sources=tuple(sorted(i for i, _ in sources)),
            targets=tuple(sorted(i for i, _ in targets)),
        )
        if not sources:
            return _with_note(found, f"no decoding instance under TPOT {_ms(floor)}")
        moving = {i: tuple(r.key for r in _running(packing.instances[i])) for i, _ in sources}

        def fits(source: str, target: str) -> bool:
            extra = len(moving[source])
            after = predict_tpot(packing.instances[target], packing.model, extra)
            return after is not None and after < dispatch

        pair = consolidation_pair(sources, targets, lambda i: bool(moving[i]), fits)
        if pair is None:
            return _with_note(
                found, f"no target stays under TPOT {_ms(dispatch)} with a source's requests"
            )
        source, target = pair
        return Proposal(
            found.sources, found.targets, (Migration(self.name, source, target, moving[source]),)
        )


POLICY_TABLE: Mapping[str, Policy] = MappingProxyType(
    {
        "decode_load": LoadBalancePolicy(
            "decode_load",
            InferType.DECODE,
            lambda c: c.decode_load_metric,
            lambda c: c.decode_load_threshold,
        ),
        "neutral_load": LoadBalancePolicy(
            "neutral_load",
            InferType.NEUTRAL,
            lambda c: c.neutral_load_metric,
            lambda c: c.neutral_load_threshold,
        ),
        "prefill_failover": FailoverPolicy("prefill_failover", InferType.PREFILL),
        "decode_failover": FailoverPolicy("decode_failover", InferType.DECODE),
        "neutral_failover": FailoverPolicy("neutral_failover", InferType.NEUTRAL),
        "binpacking_mitigation": BinpackingMitigation(),
        "binpacking_consolidation": BinpackingConsolidation(),
    }
)
