"""Periodic tasks sleep to the next beat of their period, so tasks of one period wake the
process together."""

import pytest

from fleet.clock import to_next_beat


@pytest.mark.parametrize(
    ("now", "period", "expected"),
    [
        (10.0, 0.25, 0.25),  # on a beat: a whole period to the next
        (10.05, 0.2, 0.15),
        (10.24, 0.25, 0.01),
        (3.7, 1.0, 0.3),
        (10.249, 0.25, 0.251),  # within 1% of a period short of a beat: on it
    ],
)
def test_the_delay_reaches_the_next_multiple_of_the_period(
    now: float, period: float, expected: float
) -> None:
    delay = to_next_beat(now, period)
    assert delay == pytest.approx(expected, abs=1e-9)
    assert period * 0.01 < delay <= period * 1.01


@pytest.mark.parametrize("ms", [1234600, 1000, 777777800, 5200])
def test_a_millisecond_clock_on_a_beat_of_a_fifth_waits_a_whole_period(ms: int) -> None:
    # uvloop's clock counts whole milliseconds; 1234.6 % 0.2 is 0.1999..., one float step
    # short of the beat, which must not read as a beat due at once.
    assert to_next_beat(ms / 1000, 0.2) == pytest.approx(0.2, abs=1e-9)


def test_tasks_started_at_different_moments_wake_at_the_same_instant() -> None:
    period = 0.2
    wakes = {round(now + to_next_beat(now, period), 9) for now in (100.01, 100.07, 100.13, 100.19)}
    assert wakes == {100.2}
