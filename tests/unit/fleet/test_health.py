"""The active-health rule: health-check results in a row, in, a backend's health out."""

from __future__ import annotations

from fleet.changes import add_backend
from fleet.health import CheckVerdict, judge_check
from fleet.registry import FleetRegistry
from fleet.types import BackendSpec


def run(results: str, healthy: bool = True, unhealthy_after: int = 2) -> list[CheckVerdict]:
    """Judge checks in a row ("+" a pass, "-" a failure), each from the last one's verdict."""
    failures = 0
    verdicts = []
    for mark in results:
        verdict = judge_check(mark == "+", healthy, failures, unhealthy_after)
        healthy, failures = verdict.healthy, verdict.failures
        verdicts.append(verdict)
    return verdicts


def test_one_failure_is_tolerated_two_in_a_row_take_a_healthy_backend_out() -> None:
    assert [v.healthy for v in run("--")] == [True, False]
    assert [v.went_down for v in run("--")] == [False, True]


def test_a_pass_brings_a_backend_back_and_the_count_starts_again() -> None:
    verdicts = run("--+-+--")
    assert [v.healthy for v in verdicts] == [True, False, True, True, True, True, False]
    assert [v.failures for v in verdicts] == [1, 2, 0, 1, 0, 1, 2]
    assert [v.went_down for v in verdicts] == [False, True, False, False, False, False, True]


def test_went_down_is_said_once_when_the_failures_reach_the_threshold() -> None:
    verdicts = run("-----", unhealthy_after=3)
    assert [v.went_down for v in verdicts] == [False, False, True, False, False]
    assert [v.healthy for v in verdicts] == [True, True, False, False, False]


def test_a_backend_out_already_stays_out_until_a_pass_and_still_goes_down_at_the_threshold() -> (
    None
):
    # Out already: taken out by a refused request, or new and not yet checked.
    verdicts = run("--+", healthy=False)
    assert [v.healthy for v in verdicts] == [False, False, True]
    assert [v.went_down for v in verdicts] == [False, True, False]


def test_unhealthy_after_one_takes_a_backend_out_at_its_first_failure() -> None:
    verdicts = run("-+", unhealthy_after=1)
    assert [(v.healthy, v.went_down) for v in verdicts] == [(False, True), (True, False)]


def test_a_backend_added_at_run_time_waits_for_its_first_check_a_configured_one_does_not() -> None:
    fleet = FleetRegistry(stale_after=1.0)
    configured = fleet.add(BackendSpec(id="a", url="http://a.test"))
    added = add_backend(fleet, BackendSpec(id="b", url="http://b.test"))
    assert configured.healthy and not added.healthy
