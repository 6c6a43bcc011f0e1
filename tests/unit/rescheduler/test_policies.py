"""Each policy through `decide`, one policy configured at a time."""

from __future__ import annotations

from typing import Any

import pytest

from rescheduler.config import FailoverDomain, ReschedulerConfig, Scope, SelectOrder, SelectRule
from rescheduler.decide import PolicyOutcome, decide
from rescheduler.policies import POLICY_TABLE
from rescheduler.view import InferType, InstanceView, Migration
from tests.unit.rescheduler.builders import NOW, cfg, inst, req, reqs, view

D, N, P = InferType.DECODE, InferType.NEUTRAL, InferType.PREFILL


def outcome(instances: tuple[InstanceView, ...], config: ReschedulerConfig) -> PolicyOutcome:
    (only,) = decide(view(*instances), config, NOW).outcomes
    return only


def pairs(o: PolicyOutcome) -> list[tuple[str, str]]:
    return [(m.source, m.target) for m in o.migrations]


def test_every_policy_name_has_a_policy_of_that_name() -> None:
    assert all(POLICY_TABLE[name].name == name for name in POLICY_TABLE)


# --- load balancing -------------------------------------------------------------------------

ONE_SHORTEST = {"req_select_rule": SelectRule.NUM_REQ, "req_select_value": 1}


def loaded(id: str, load: float, infer_type: InferType = D, **fields: Any) -> InstanceView:
    return inst(id, infer_type, kv_usage=load, requests=reqs(id, 3), **fields)


def balance(*policies: str, **fields: Any) -> ReschedulerConfig:
    fields.setdefault("decode_load_metric", "kv_cache_usage_ratio")
    fields.setdefault("neutral_load_metric", "kv_cache_usage_ratio")
    fields.setdefault("decode_load_threshold", 0.7)
    fields.setdefault("neutral_load_threshold", 0.7)
    return cfg(*policies, **ONE_SHORTEST, **fields)


def test_decode_load_worked_example() -> None:
    fleet = (
        loaded("d1", 0.9),
        loaded("d2", 0.3),
        loaded("d3", 0.8),
        loaded("d4", 0.2),
        loaded("d5", 0.4),
    )
    o = outcome(fleet, balance("decode_load"))
    assert pairs(o) == [("d1", "d4"), ("d3", "d2")]
    assert o.sources == ("d1", "d3")
    assert o.targets == ("d2", "d4", "d5")
    assert [m.requests for m in o.migrations] == [("d1-0",), ("d3-0",)]
    assert all(m.policy == "decode_load" for m in o.migrations)


@pytest.mark.parametrize(
    ("fleet", "fields", "expected"),
    [
        # other infer types are not decode_load's business
        (
            (loaded("d1", 0.9), loaded("n1", 0.1, N), loaded("p1", 0.1, P), loaded("d2", 0.5)),
            {},
            [("d1", "d2")],
        ),
        # unschedulable or stale instances neither give nor take
        (
            (
                loaded("d1", 0.9),
                loaded("d0", 0.95, schedulable=False),
                loaded("d2", 0.1, scraped_at=None),
                loaded("d3", 0.1, scraped_at=NOW - 61),
                loaded("d4", 0.5),
            ),
            {},
            [("d1", "d4")],
        ),
        # the difference must exceed load_balance_threshold
        ((loaded("d1", 0.9), loaded("d2", 0.5)), {"load_balance_threshold": 0.4}, []),
        ((loaded("d1", 0.9), loaded("d2", 0.5)), {"load_balance_threshold": 0.39}, [("d1", "d2")]),
        # the threshold itself counts as over
        ((loaded("d1", 0.7), loaded("d2", 0.5)), {}, [("d1", "d2")]),
        # unit scope: pairs only within a unit; an instance without a unit is in none
        (
            (
                loaded("a1", 0.9, unit="A"),
                loaded("a2", 0.6, unit="A"),
                loaded("b1", 0.8, unit="B"),
                loaded("b2", 0.1, unit="B"),
                loaded("x1", 0.95),
                loaded("x2", 0.0),
            ),
            {"load_balance_scope": Scope.UNIT},
            [("a1", "a2"), ("b1", "b2")],
        ),
        (
            (
                loaded("a1", 0.9, unit="A"),
                loaded("a2", 0.6, unit="A"),
                loaded("b1", 0.8, unit="B"),
                loaded("b2", 0.1, unit="B"),
            ),
            {"load_balance_scope": Scope.CLUSTER},
            [("a1", "b2"), ("b1", "a2")],
        ),
        # the configured metric decides: d2 has more waiting requests though less KV
        (
            (
                loaded("d1", 0.9, num_waiting=0),
                loaded("d2", 0.1, num_waiting=9),
                loaded("d3", 0.5, num_waiting=1),
            ),
            {"decode_load_metric": "num_waiting_requests", "decode_load_threshold": 5},
            [("d2", "d1")],
        ),
    ],
)
def test_decode_load(
    fleet: tuple[InstanceView, ...], fields: dict[str, Any], expected: list[tuple[str, str]]
) -> None:
    assert pairs(outcome(fleet, balance("decode_load", **fields))) == expected


def test_neutral_load_uses_its_own_metric_and_threshold() -> None:
    fleet = (
        loaded("n1", 0.6, N, num_running=9),
        loaded("n2", 0.1, N, num_running=1),
        loaded("n3", 0.2, N, num_running=2),
        loaded("d1", 0.9),
        loaded("d2", 0.1),
    )
    config = balance(
        "neutral_load",
        neutral_load_metric="decode_batch_size",
        neutral_load_threshold=5,
        decode_load_threshold=0.5,
    )
    assert pairs(outcome(fleet, config)) == [("n1", "n2")]


@pytest.mark.parametrize(
    ("fleet", "note"),
    [
        ((loaded("d1", 0.9, schedulable=False),), "no schedulable, fresh decode instance"),
        (
            (loaded("d1", 0.5), loaded("d2", 0.1)),
            "no source at or over threshold 0.7 (kv_cache_usage_ratio)",
        ),
        (
            (loaded("d1", 0.9), loaded("d2", 0.8)),
            "no target under threshold 0.7 (kv_cache_usage_ratio)",
        ),
        (
            (loaded("d1", 0.7), loaded("d2", 0.7 - 1e-12)),
            "no source-target pair differs by more than 0.001",
        ),
        (
            (inst("d1", kv_usage=0.9, requests=(req("a", movable=False),)), loaded("d2", 0.1)),
            "the paired sources have no movable request SR/NUM_REQ picks",
        ),
    ],
)
def test_decode_load_says_why_nothing_moves(fleet: tuple[InstanceView, ...], note: str) -> None:
    o = outcome(fleet, balance("decode_load", load_balance_threshold=0.001))
    assert o.migrations == ()
    assert o.note == note


# --- failover -------------------------------------------------------------------------------


def test_decode_failover_worked_example_node_domain() -> None:
    fleet = (
        inst("decode-1", node="n1"),
        inst("decode-2", node="n2"),
        inst("decode-3", node="n2", schedulable=False, requests=reqs("r", 5)),
        inst("decode-4", node="n3"),
        inst("prefill-1", P, node="n4"),
    )
    o = outcome(fleet, cfg("decode_failover", failover_domain=FailoverDomain.NODE))
    assert o.sources == ("decode-3",)
    assert o.targets == ("decode-1", "decode-4")
    assert o.migrations == (
        Migration("decode_failover", "decode-3", "decode-1", ("r-0", "r-2", "r-4")),
        Migration("decode_failover", "decode-3", "decode-4", ("r-1", "r-3")),
    )


def test_failover_moves_every_movable_request_ignoring_the_select_rule() -> None:
    requests = (
        req("late", arrived=9),
        req("waiting", arrived=5, running=False),
        req("pinned", arrived=1, movable=False),
        req("early", arrived=2, prompt=50_000),
    )
    fleet = (inst("d1", scraped_at=NOW - 120, requests=requests), inst("d2"))
    config = cfg("decode_failover", req_select_rule=SelectRule.NUM_REQ, req_select_value=1)
    o = outcome(fleet, config)
    assert o.migrations == (Migration("decode_failover", "d1", "d2", ("early", "waiting", "late")),)


@pytest.mark.parametrize(
    ("policy", "kind"),
    [("prefill_failover", P), ("decode_failover", D), ("neutral_failover", N)],
)
def test_each_failover_policy_keeps_to_its_type(policy: str, kind: InferType) -> None:
    fleet = tuple(
        inst(f"{t.value}-{k}", t, schedulable=k != 0, requests=reqs(f"{t.value}{k}", 1))
        for t in (P, D, N)
        for k in range(2)
    )
    o = outcome(fleet, cfg(policy))
    assert o.migrations == (
        Migration(policy, f"{kind.value}-0", f"{kind.value}-1", (f"{kind.value}0-0",)),
    )


def test_failover_targets_are_healthy_and_outside_every_failed_domain() -> None:
    fleet = (
        inst("a1", node="A", scraped_at=None, requests=reqs("a", 2)),
        inst("a2", node="A"),
        inst("b1", node="B", schedulable=False, requests=reqs("b", 2)),
        inst("b2", node="B"),
        inst("c1", node="C"),
        inst("d1", node="D"),
        inst("e1", node="E", scraped_at=NOW - 61),  # stale: a source, not a target
    )
    o = outcome(fleet, cfg("decode_failover", failover_domain=FailoverDomain.NODE))
    assert o.sources == ("a1", "b1", "e1")
    assert o.targets == ("c1", "d1")
    assert [(m.source, m.target, m.requests) for m in o.migrations] == [
        ("a1", "c1", ("a-0",)),
        ("a1", "d1", ("a-1",)),
        ("b1", "c1", ("b-0",)),
        ("b1", "d1", ("b-1",)),
    ]


@pytest.mark.parametrize(
    ("fleet", "note"),
    [
        ((inst("d1"), inst("d2")), "no decode instance needs failover"),
        (
            (inst("d1", schedulable=False, requests=(req("x", movable=False),)), inst("d2")),
            "the failed instances hold no movable request",
        ),
        (
            (
                inst("d1", node="A", schedulable=False, requests=reqs("r", 1)),
                inst("d2", node="A"),
            ),
            "no schedulable, fresh decode instance outside the node failure domain",
        ),
    ],
)
def test_failover_says_why_nothing_moves(fleet: tuple[InstanceView, ...], note: str) -> None:
    o = outcome(fleet, cfg("decode_failover", failover_domain=FailoverDomain.NODE))
    assert o.migrations == ()
    assert o.note == note


# --- binpacking -----------------------------------------------------------------------------

# slo 50 ms: migrate out at >= 47.5 ms, dispatch under 42.5 ms, consolidate under 30 ms.
SLO = {"tpot_slo_s": 0.050}


def decoding(id: str, batch: int, itl: float | None, kind: InferType = D, **f: Any) -> InstanceView:
    """An instance decoding `batch` running requests (id-0 shortest) at `itl` seconds."""
    running = tuple(req(f"{id}-{k}", arrived=float(k), prompt=100 + 10 * k) for k in range(batch))
    f.setdefault("requests", running)
    return inst(id, kind, num_running=batch, recent_itl_s=itl, **f)


def test_mitigation_worked_example() -> None:
    fleet = (decoding("D1", 24, 0.048), decoding("D2", 11, 0.035))
    config = cfg(
        "binpacking_mitigation", req_select_rule=SelectRule.NUM_REQ, req_select_value=2, **SLO
    )
    o = outcome(fleet, config)
    assert o.sources == ("D1",)
    assert o.targets == ("D2",)
    assert o.migrations == (Migration("binpacking_mitigation", "D1", "D2", ("D1-0", "D1-1")),)


def test_consolidation_worked_example() -> None:
    waiting = req("D3-w", arrived=9, running=False)
    fleet = (
        decoding("D3", 1, 0.025, requests=(req("D3-0"), waiting)),
        decoding("D4", 20, 0.040),
    )
    o = outcome(fleet, cfg("binpacking_consolidation", **SLO))
    assert o.sources == ("D3",)
    assert o.targets == ("D3", "D4")
    # all its running requests; the waiting one is not a decode request
    assert o.migrations == (Migration("binpacking_consolidation", "D3", "D4", ("D3-0",)),)


def test_consolidation_skips_a_target_the_move_would_push_over_dispatch() -> None:
    # Fitted line 0.020 + 0.001 * batch: D4 with 5 more reaches 45 ms > 42.5 ms, D5 with 5
    # more 30 * (0.035 / 0.030) = 35 ms.
    fleet = (
        decoding("D3", 5, 0.025),
        decoding("D4", 20, 0.040),
        decoding("D5", 10, 0.030),
    )
    o = outcome(fleet, cfg("binpacking_consolidation", **SLO))
    assert pairs(o) == [("D3", "D5")]
    assert o.migrations[0].requests == tuple(f"D3-{k}" for k in range(5))


def test_mitigation_moves_running_requests_only_and_one_pair_a_cycle() -> None:
    hot = decoding(
        "hot", 24, 0.060, requests=(*reqs("hot", 3), req("hot-w", arrived=-1, running=False))
    )
    fleet = (
        hot,
        decoding("warm", 24, 0.048),
        decoding("cool", 11, 0.035),
        decoding("cold", 5, 0.020),
    )
    config = cfg(
        "binpacking_mitigation",
        req_select_rule=SelectRule.NUM_REQ,
        req_select_value=1,
        req_select_order=SelectOrder.FCW,  # stands for FCR: binpacking moves running requests
        **SLO,
    )
    o = outcome(fleet, config)
    assert o.sources == ("hot", "warm")
    assert o.targets == ("cold", "cool")
    assert o.migrations == (Migration("binpacking_mitigation", "hot", "cold", ("hot-0",)),)


def test_binpacking_leaves_prefill_and_reserved_instances_alone() -> None:
    fleet = (
        decoding("p-hot", 24, 0.060, P),
        decoding("reserved-cold", 2, 0.020, N, prefill_reserved=True),
        decoding("n-hot", 24, 0.048, N),
        decoding("d-cool", 11, 0.035),
        decoding("stale-cold", 2, 0.020, scraped_at=None),
    )
    o = outcome(fleet, cfg("binpacking_mitigation", **SLO))
    assert o.sources == ("n-hot",)
    assert o.targets == ("d-cool",)
    assert pairs(o) == [("n-hot", "d-cool")]


def test_consolidation_needs_a_decode_batch_on_both_sides() -> None:
    fleet = (decoding("idle", 0, None), decoding("busy", 20, 0.040), decoding("light", 2, 0.021))
    o = outcome(fleet, cfg("binpacking_consolidation", **SLO))
    assert o.sources == ("light",)
    assert "idle" not in o.targets
    assert pairs(o) == [("light", "busy")]


@pytest.mark.parametrize(
    ("policy", "fleet", "note"),
    [
        (
            "binpacking_mitigation",
            (decoding("a", 0, None), decoding("b", 4, None)),
            "TPOT unknown: no fresh instance reports an inter-token latency while decoding",
        ),
        (
            "binpacking_consolidation",
            (decoding("a", 3, 0.02, P),),
            "no schedulable, fresh decode or neutral instance outside prefill reserve",
        ),
        (
            "binpacking_mitigation",
            (decoding("a", 10, 0.040), decoding("b", 20, 0.045)),
            "no instance at or over TPOT 47.5 ms",
        ),
        (
            "binpacking_mitigation",
            (decoding("a", 10, 0.048), decoding("b", 20, 0.050)),
            "no instance under TPOT 42.5 ms",
        ),
        (
            "binpacking_mitigation",
            (
                decoding("a", 10, 0.048, requests=(req("x", movable=False),)),
                decoding("b", 5, 0.030),
            ),
            "no source has a movable running request to a target",
        ),
        (
            "binpacking_consolidation",
            (decoding("a", 10, 0.035), decoding("b", 20, 0.045)),
            "no decoding instance under TPOT 30 ms",
        ),
        (
            "binpacking_consolidation",
            (decoding("a", 5, 0.025), decoding("b", 20, 0.040)),
            "no target stays under TPOT 42.5 ms with a source's requests",
        ),
    ],
)
def test_binpacking_says_why_nothing_moves(
    policy: str, fleet: tuple[InstanceView, ...], note: str
) -> None:
    o = outcome(fleet, cfg(policy, **SLO))
    assert o.migrations == ()
    assert o.note == note
