"""Outcome-based ejection decisions, on a clock the tests move by hand."""

from __future__ import annotations

from fleet.outliers import (
    BackendActivity,
    CapReached,
    Eject,
    OutlierDetector,
    OutlierSettings,
    Restore,
    stalled_backends,
)

SETTINGS = OutlierSettings(
    consecutive_failures=3,
    window_s=10.0,
    base_ejection_s=5.0,
    max_ejection_s=30.0,
    max_ejected_fraction=0.5,
)


def fail(d: OutlierDetector, backend: str, times: int, now: float, fleet: int = 4) -> object:
    action: object = None
    for _ in range(times):
        action = d.failure(backend, "status", now, fleet)
    return action


def test_consecutive_failures_eject_for_the_base_time() -> None:
    d = OutlierDetector(SETTINGS)
    assert fail(d, "a", 2, 100.0) is None
    action = d.failure("a", "connect", 100.0, 4)
    assert action == Eject("a", "status", 105.0, 1)  # the most frequent kind names it
    state = d.state("a")
    assert state is not None and state.until == 105.0


def test_a_success_or_a_quiet_window_breaks_the_run() -> None:
    d = OutlierDetector(SETTINGS)
    fail(d, "a", 2, 100.0)
    d.success("a")
    assert fail(d, "a", 2, 101.0) is None
    # Failures further apart than the window do not chain.
    assert d.failure("a", "status", 120.0, 4) is None
    assert fail(d, "a", 1, 121.0) is None
    assert isinstance(d.failure("a", "status", 122.0, 4), Eject)


def test_failures_while_ejected_count_for_nothing_and_the_ejection_ends_on_time() -> None:
    d = OutlierDetector(SETTINGS)
    fail(d, "a", 3, 100.0)
    assert fail(d, "a", 10, 101.0) is None
    assert d.due(104.9) == []
    assert d.due(105.0) == [Restore("a", "status")]
    assert d.state("a") is None
    assert d.due(106.0) == []


def test_probation_re_ejects_on_the_first_failure_with_a_doubled_back_off() -> None:
    d = OutlierDetector(SETTINGS)
    fail(d, "a", 3, 100.0)
    d.due(105.0)
    action = d.failure("a", "status", 106.0, 4)
    assert action == Eject("a", "status", 116.0, 2)  # 5 s doubled
    d.due(116.0)
    assert d.failure("a", "status", 117.0, 4) == Eject("a", "status", 137.0, 3)
    d.due(137.0)
    # Capped at max_ejection_s.
    assert d.failure("a", "status", 138.0, 4) == Eject("a", "status", 168.0, 4)


def test_a_success_ends_probation() -> None:
    d = OutlierDetector(SETTINGS)
    fail(d, "a", 3, 100.0)
    d.due(105.0)
    d.success("a")
    assert d.failure("a", "status", 106.0, 4) is None


def test_the_back_off_starts_over_after_a_long_quiet_spell() -> None:
    d = OutlierDetector(SETTINGS)
    fail(d, "a", 3, 100.0)
    d.due(105.0)
    d.success("a")
    # 30 s cap + 5 s ejection later, a new run is a first ejection again.
    action = fail(d, "a", 3, 200.0)
    assert action == Eject("a", "status", 205.0, 1)


def test_the_cap_keeps_part_of_the_fleet_in_routing() -> None:
    d = OutlierDetector(SETTINGS)
    assert isinstance(fail(d, "a", 3, 100.0, fleet=4), Eject)
    assert isinstance(fail(d, "b", 3, 100.0, fleet=4), Eject)
    refused = fail(d, "c", 3, 100.0, fleet=4)
    assert refused == CapReached("c", "status", 2)
    # Its failures keep counting: once a slot frees, the next one ejects it.
    d.due(105.0)
    assert isinstance(d.failure("c", "status", 105.5, 4), Eject)


def test_one_backend_can_always_be_ejected() -> None:
    d = OutlierDetector(SETTINGS)
    assert isinstance(fail(d, "a", 3, 100.0, fleet=1), Eject)
    assert isinstance(fail(d, "b", 3, 100.0, fleet=2), CapReached)


def test_a_stall_ejects_at_once_and_forget_drops_the_state() -> None:
    d = OutlierDetector(SETTINGS)
    assert d.stalled("a", 50.0, 4) == Eject("a", "stalled", 55.0, 1)
    assert d.stalled("a", 51.0, 4) is None  # already out
    d.forget("a")
    assert d.state("a") is None
    assert d.ejected() == 0


def activity(
    wait: float | None, read: float, progress: float | None, backend: str = "a"
) -> BackendActivity:
    return BackendActivity(backend, wait, read, progress)


def test_stall_needs_a_long_wait_and_silence_and_an_idle_engine() -> None:
    now = 100.0
    stalled = activity(wait=90.0, read=90.0, progress=None)
    assert stalled_backends([stalled], now, 5.0) == ["a"]
    # Waiting, but not for long enough.
    assert stalled_backends([activity(96.0, 90.0, None)], now, 5.0) == []
    # Another request on it read a byte lately: the backend answers.
    assert stalled_backends([activity(90.0, 97.0, None)], now, 5.0) == []
    # Its engine's counters moved lately: busy (a long prefill, a queue), not stalled.
    assert stalled_backends([activity(90.0, 90.0, 98.0)], now, 5.0) == []
    # Nothing waits.
    assert stalled_backends([activity(None, 0.0, None)], now, 5.0) == []
    both = [stalled, activity(99.0, 0.0, None, backend="b")]
    assert stalled_backends(both, now, 5.0) == ["a"]
