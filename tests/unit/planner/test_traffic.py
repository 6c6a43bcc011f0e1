"""An interval's traffic from counter deltas: rate, means, resets, backends coming and going."""

from __future__ import annotations

import pytest

from fleet.types import Role
from planner.observe import Sample
from planner.traffic import BackendReading, RequestCounters, observe_traffic


def pull(at: float, *readings: BackendReading) -> Sample:
    return Sample(at, None, None, 0, 0, readings=readings)


def decode(
    backend: str, running: float, finished: float, tokens_in: float, tokens_out: float
) -> BackendReading:
    """A decode engine whose requests all had 1000 prompt and 100 output tokens, 0.025 s ITL."""
    counters = RequestCounters(
        requests_finished=finished,
        prompt_len_sum=tokens_in,
        prompt_len_count=tokens_in / 1000,
        output_len_sum=tokens_out,
        output_len_count=tokens_out / 100,
        ttft_sum=finished * 0.01,  # the decode leg's own first token: not the prefill's
        ttft_count=finished,
        itl_sum=tokens_out * 0.025,
        itl_count=tokens_out,
    )
    return BackendReading(backend, Role.DECODE, running, counters)


def prefill(backend: str, finished: float, ttft_sum: float, prompt_sum: float) -> BackendReading:
    counters = RequestCounters(
        requests_finished=finished,
        prompt_len_sum=prompt_sum,
        prompt_len_count=finished,
        ttft_sum=ttft_sum,
        ttft_count=finished,
    )
    return BackendReading(backend, Role.PREFILL, 0.0, counters)


def test_disaggregated_interval_hand_computed() -> None:
    first = pull(
        0.0,
        decode("d0", 4, 10, 10_000, 1_000),
        decode("d1", 6, 0, 0, 0),
        prefill("p0", 10, 1.0, 10_000),
    )
    last = pull(
        10.0,
        decode("d0", 8, 60, 60_000, 6_000),  # +50 requests
        decode("d1", 12, 50, 50_000, 5_000),  # +50
        prefill("p0", 110, 21.0, 160_000),  # +100 prefills, 20 s of TTFT, 150k tokens
    )
    t = observe_traffic([first, last])
    assert t is not None
    assert t.seconds == 10.0
    assert t.rate == 10.0  # 100 finished on the decode side / 10 s (prefill legs not counted)
    assert (t.isl, t.osl) == (1000.0, 100.0)
    assert t.context == 1050.0  # 1000 + 100 / 2
    assert t.ttft == pytest.approx(0.2)  # the prefill side's 20 s / 100
    assert t.ttft_isl == 1500.0  # 150k / 100 on the prefill side
    assert t.itl == pytest.approx(0.025)
    assert t.in_flight == 7.5  # (4 + 6) / 2 = 5 at the first pull, (8 + 12) / 2 = 10 at the last


def test_aggregated_fleet_takes_ttft_from_its_workers() -> None:
    both = [
        pull(0.0, BackendReading("w", Role.BOTH, 1, RequestCounters(ttft_sum=1, ttft_count=4))),
        pull(
            4.0,
            BackendReading(
                "w", Role.BOTH, 3, RequestCounters(requests_finished=8, ttft_sum=3, ttft_count=12)
            ),
        ),
    ]
    t = observe_traffic(both)
    assert t is not None
    assert t.rate == 2.0 and t.ttft == 0.25  # 8 / 4 s; (3 - 1) / (12 - 4)
    assert t.isl is None and t.osl is None and t.context is None  # the histograms did not move
    assert t.in_flight == 2.0


def test_a_counter_reset_drops_that_backend_for_the_interval() -> None:
    window = [
        pull(0.0, decode("d0", 1, 10, 10_000, 1_000), decode("d1", 1, 500, 500_000, 50_000)),
        pull(10.0, decode("d0", 1, 60, 60_000, 6_000), decode("d1", 1, 20, 20_000, 2_000)),
    ]
    t = observe_traffic(window)
    assert t is not None
    assert t.rate == 5.0  # d0's 50 only: d1 restarted (its counters went down)


def test_backends_count_from_their_first_to_their_last_reading() -> None:
    window = [
        pull(0.0, decode("d0", 2, 0, 0, 0), decode("gone", 2, 0, 0, 0)),
        pull(5.0, decode("d0", 2, 20, 20_000, 2_000), decode("new", 2, 100, 100_000, 10_000)),
        pull(6.0),  # a pull with no reading (every worker unscraped) is skipped
        pull(10.0, decode("d0", 2, 40, 40_000, 4_000), decode("new", 2, 130, 130_000, 13_000)),
    ]
    t = observe_traffic(window)
    assert t is not None
    # d0: +40; new: +30 from its first reading at 5 s; gone: one reading, no delta.
    assert t.rate == 7.0
    assert t.in_flight == 2.0


@pytest.mark.parametrize(
    "window",
    [
        [],
        [pull(0.0, decode("d0", 1, 0, 0, 0))],
        [pull(3.0, decode("d0", 1, 0, 0, 0)), pull(3.0, decode("d0", 1, 5, 5000, 500))],
        [pull(0.0, prefill("p0", 0, 0, 0)), pull(5.0, prefill("p0", 5, 1, 5000))],
    ],
    ids=["empty", "one pull", "no time", "prefill only"],
)
def test_no_traffic_without_a_decode_side_delta(window: list[Sample]) -> None:
    assert observe_traffic(window) is None
