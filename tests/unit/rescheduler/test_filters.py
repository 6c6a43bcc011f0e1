from __future__ import annotations

import pytest

from rescheduler.config import FailoverDomain
from rescheduler.filters import failure_domain, is_fresh, is_healthy, needs_failover, of_types
from rescheduler.view import InferType, InstanceView
from tests.unit.rescheduler.builders import NOW, inst

STALENESS = 60.0


@pytest.mark.parametrize(
    ("scraped_at", "fresh"),
    [
        (None, False),
        (NOW, True),
        (NOW - 60.0, True),  # exactly at the limit is still fresh
        (NOW - 60.5, False),
    ],
)
def test_is_fresh(scraped_at: float | None, fresh: bool) -> None:
    assert is_fresh(inst("a", scraped_at=scraped_at), NOW, STALENESS) is fresh


@pytest.mark.parametrize(
    ("schedulable", "scraped_at", "healthy"),
    [
        (True, NOW, True),
        (False, NOW, False),
        (True, None, False),
        (True, NOW - 100, False),
    ],
)
def test_healthy_and_needs_failover_are_opposites(
    schedulable: bool, scraped_at: float | None, healthy: bool
) -> None:
    instance = inst("a", schedulable=schedulable, scraped_at=scraped_at)
    assert is_healthy(instance, NOW, STALENESS) is healthy
    assert needs_failover(instance, NOW, STALENESS) is not healthy


def test_of_types_keeps_the_types_sorted_by_id() -> None:
    fleet = [
        inst("d2"),
        inst("p1", InferType.PREFILL),
        inst("n1", InferType.NEUTRAL),
        inst("d1"),
    ]
    assert [i.id for i in of_types(fleet, (InferType.DECODE,))] == ["d1", "d2"]
    assert [i.id for i in of_types(fleet, (InferType.DECODE, InferType.NEUTRAL))] == [
        "d1",
        "d2",
        "n1",
    ]


# Two nodes, three units; unit u2 spans both nodes. x has no node and no unit.
FLEET = (
    inst("a1", node="A", unit="u1"),
    inst("a2", node="A", unit="u2"),
    inst("b1", node="B", unit="u2"),
    inst("b2", node="B", unit="u3"),
    inst("b3", InferType.PREFILL, node="B", unit="u3"),
    inst("x"),
    inst("y"),
)
BY_ID = {i.id: i for i in FLEET}


@pytest.mark.parametrize(
    ("failed", "domain", "excluded"),
    [
        (["a1"], FailoverDomain.INSTANCE, {"a1"}),
        (["a1"], FailoverDomain.NODE, {"a1", "a2"}),
        (["a1"], FailoverDomain.INSTANCE_UNIT, {"a1"}),  # alone in u1
        (["a2"], FailoverDomain.INSTANCE_UNIT, {"a2", "b1"}),
        # node A's units are u1 and u2; u2 reaches b1 on node B
        (["a1"], FailoverDomain.NODE_UNIT, {"a1", "a2", "b1"}),
        # units and nodes span infer types: the prefill b3 shares node B and unit u3
        (["b2"], FailoverDomain.NODE, {"b1", "b2", "b3"}),
        (["b2"], FailoverDomain.INSTANCE_UNIT, {"b2", "b3"}),
        (["b2"], FailoverDomain.NODE_UNIT, {"a2", "b1", "b2", "b3"}),
        # empty node / unit groups the instance with nobody
        (["x"], FailoverDomain.NODE, {"x"}),
        (["x"], FailoverDomain.INSTANCE_UNIT, {"x"}),
        (["x"], FailoverDomain.NODE_UNIT, {"x"}),
        # several failed instances: the union of their domains
        (["a1", "x"], FailoverDomain.NODE, {"a1", "a2", "x"}),
    ],
)
def test_failure_domain(failed: list[str], domain: FailoverDomain, excluded: set[str]) -> None:
    failed_views: list[InstanceView] = [BY_ID[f] for f in failed]
    assert failure_domain(failed_views, FLEET, domain) == excluded
