"""The plan as a whole: policy order, validation across policies, config checks, purity."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from rescheduler.config import POLICIES, SelectOrder, SelectRule
from rescheduler.decide import Plan, check_config, decide
from rescheduler.view import InstanceView, Migration
from tests.unit.rescheduler.builders import NOW, cfg, inst, req, reqs, view

SLO = {"tpot_slo_s": 0.050}
KV = {"decode_load_metric": "kv_cache_usage_ratio", "decode_load_threshold": 0.7}
ONE_SHORTEST = {
    "req_select_rule": SelectRule.NUM_REQ,
    "req_select_value": 1,
    "req_select_order": SelectOrder.SR,
}


def decoding(id: str, kv: float, batch: int, itl: float | None) -> InstanceView:
    return inst(id, kv_usage=kv, num_running=batch, recent_itl_s=itl, requests=reqs(id, batch))


def test_a_reverse_pair_is_dropped() -> None:
    # a is KV-heavy but fast, b KV-light but slow: load balancing sends a -> b, mitigation
    # would send b -> a in the same cycle.
    fleet = view(decoding("a", 0.9, 5, 0.020), decoding("b", 0.1, 24, 0.048))
    plan = decide(fleet, cfg("decode_load", "binpacking_mitigation", **KV, **SLO), NOW)
    load, mitigation = plan.outcomes
    assert [(m.source, m.target) for m in load.migrations] == [("a", "b")]
    assert mitigation.sources == ("b",)
    assert mitigation.targets == ("a",)
    assert mitigation.migrations == ()
    assert mitigation.note.startswith("validation kept 0 of 1 migrations")
    assert plan.migrations == load.migrations


def test_the_earlier_policy_wins_a_reverse_pair() -> None:
    # the same fleet with mitigation first: b -> a stands and load balancing's a -> b goes
    fleet = view(decoding("a", 0.9, 5, 0.020), decoding("b", 0.1, 24, 0.048))
    plan = decide(fleet, cfg("binpacking_mitigation", "decode_load", **KV, **SLO), NOW)
    assert [(m.policy, m.source, m.target) for m in plan.migrations] == [
        ("binpacking_mitigation", "b", "a")
    ]


def test_a_request_is_in_one_migration_and_an_emptied_migration_is_dropped() -> None:
    # h is over the KV threshold and the TPOT ceiling: both policies pick its shortest
    # request, h-0; load balancing (first) sends it to the least KV, mitigation would send it
    # to the lowest TPOT.
    fleet = view(
        decoding("h", 0.9, 24, 0.048),
        decoding("kv-light", 0.1, 11, 0.040),
        decoding("fast", 0.5, 5, 0.020),
    )
    config = cfg("decode_load", "binpacking_mitigation", **KV, **SLO, **ONE_SHORTEST)
    plan = decide(fleet, config, NOW)
    assert plan.migrations == (Migration("decode_load", "h", "kv-light", ("h-0",)),)
    assert plan.outcomes[1].migrations == ()
    assert "0 of 1 migrations (0 of 1 requests)" in plan.outcomes[1].note


def test_requests_already_moving_are_removed_and_the_rest_still_move() -> None:
    # l is KV-heavy and fast: load balancing moves its shortest request l-0, consolidation
    # then moves all of l's running requests, less l-0.
    fleet = view(
        decoding("l", 0.9, 3, 0.020),
        decoding("kv-light", 0.1, 0, None),
        decoding("packed", 0.5, 30, 0.040),
    )
    config = cfg("decode_load", "binpacking_consolidation", **KV, **SLO, **ONE_SHORTEST)
    plan = decide(fleet, config, NOW)
    assert plan.migrations == (
        Migration("decode_load", "l", "kv-light", ("l-0",)),
        Migration("binpacking_consolidation", "l", "packed", ("l-1", "l-2")),
    )
    assert plan.outcomes[1].note == (
        "validation kept 1 of 1 migrations (2 of 3 requests): the rest reversed an earlier "
        "pair or named requests already moving"
    )


def test_outcomes_follow_the_configured_order_one_per_policy() -> None:
    config = cfg(*reversed(POLICIES))
    plan = decide(view(inst("d1"), inst("p1")), config, NOW)
    assert tuple(o.policy for o in plan.outcomes) == tuple(reversed(POLICIES))
    assert plan.migrations == ()
    assert all(o.note for o in plan.outcomes)  # every idle policy says why


def test_an_outcome_with_migrations_has_no_note() -> None:
    fleet = view(inst("d1", schedulable=False, requests=reqs("r", 1)), inst("d2"))
    (o,) = decide(fleet, cfg("decode_failover"), NOW).outcomes
    assert o.migrations and o.note == ""


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"policies": ("decode_load", "gpu_melting")}, "gpu_melting.*known: decode_load"),
        ({"decode_load_metric": "vibes"}, "decode_load_metric 'vibes'.*kv_cache_usage_ratio"),
        ({"neutral_load_metric": "vibes"}, "neutral_load_metric 'vibes'"),
    ],
)
def test_unknown_names_are_refused(fields: dict[str, object], message: str) -> None:
    config = cfg(**fields)
    with pytest.raises(ValueError, match=message):
        check_config(config)
    with pytest.raises(ValueError, match=message):
        decide(view(), config, NOW)


def test_every_known_policy_passes_the_check() -> None:
    check_config(cfg(*POLICIES))


def test_the_plan_does_not_depend_on_the_order_instances_are_listed() -> None:
    fleet = [
        decoding("a", 0.9, 24, 0.048),
        decoding("b", 0.1, 11, 0.035),
        decoding("c", 0.8, 3, 0.020),
        decoding("d", 0.2, 30, 0.040),
        inst("e", schedulable=False, requests=(req("e-0"), req("e-1", arrived=-1))),
        inst("f", node="x"),
    ]
    config = cfg(*POLICIES, **KV, **SLO, **ONE_SHORTEST)
    plans = {decide(view(*order), config, NOW) for order in itertools.permutations(fleet)}
    assert len(plans) == 1
    (plan,) = plans
    assert plan.migrations  # the fleet gives every kind of policy something to do


def test_the_plan_is_immutable() -> None:
    plan = decide(view(), cfg(), NOW)
    assert isinstance(plan, Plan)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.migrations = ()  # type: ignore[misc]
