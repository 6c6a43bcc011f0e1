"""The decaying record of service that workers publish to compare tenants over the proxy."""

import math

import pytest

from flowcontrol.service_memory import ServiceMemory


def test_service_adds_up_and_fades_with_the_memory_as_time_constant() -> None:
    m: ServiceMemory[str] = ServiceMemory(memory=10.0)
    assert m.value("a", 0.0) == 0.0
    m.add("a", 3.0, now=0.0)
    m.add("a", 1.0, now=0.0)
    assert m.value("a", 0.0) == 4.0
    assert m.value("a", 10.0) == pytest.approx(4.0 / math.e)
    # An addition later counts in full, the earlier ones as they have faded by then.
    m.add("a", 2.0, now=10.0)
    assert m.value("a", 20.0) == pytest.approx((4.0 / math.e + 2.0) / math.e)
    assert dict(m.items(20.0)) == {"a": pytest.approx(m.value("a", 20.0))}


def test_order_between_tenants_holds_while_nobody_is_served() -> None:
    # Every figure fades at the same rate, so two workers reading them at different moments
    # still agree on who was served less.
    m: ServiceMemory[str] = ServiceMemory(memory=5.0)
    m.add("noisy", 8.0, now=0.0)
    m.add("quiet", 1.0, now=3.0)
    for now in (3.0, 4.0, 30.0):
        assert m.value("quiet", now) < m.value("noisy", now)


def test_a_reading_from_before_the_last_addition_does_not_grow() -> None:
    m: ServiceMemory[str] = ServiceMemory(memory=5.0)
    m.add("a", 2.0, now=10.0)
    assert m.value("a", 9.0) == 2.0  # a clock read just before: no negative age


def test_the_keys_kept_are_bounded_and_the_faded_or_oldest_go_first() -> None:
    m: ServiceMemory[str] = ServiceMemory(memory=1.0, max_keys=3)
    m.add("faded", 1.0, now=0.0)
    m.add("b", 1.0, now=20.0)
    m.add("c", 1.0, now=20.0)
    m.add("d", 1.0, now=20.0)
    assert len(m) == 3 and m.value("faded", 20.0) == 0.0
    m.add("e", 1.0, now=20.5)  # all still weigh: the least recently served goes
    assert len(m) == 3 and m.value("b", 20.5) == 0.0 and m.value("e", 20.5) == 1.0


def test_a_memory_must_be_positive() -> None:
    with pytest.raises(ValueError):
        ServiceMemory(memory=0.0)
