"""profile-sla's pure side: the measuring plan, the ITL window, the choice per role and the
suggested thresholds, on hand-computed data."""

from __future__ import annotations

import pytest

from planner.profile_file import ConfigProfile, DecodeData, PrefillData, SlaTarget
from planner.sla_choice import (
    ISL_FACTORS,
    DecodePoint,
    PrefillPoint,
    decode_prompt_lengths,
    fits_in_flight,
    in_flight_grid,
    isl_sweep,
    itl_after_all_started,
    recommend,
    report_lines,
    thresholds,
)

SLA = SlaTarget(isl=1000, osl=200, ttft=0.5, itl=0.045)  # target context L = 1100


def _config(
    name: str,
    num_gpu: int,
    prefill: tuple[tuple[float, float], ...],
    kv_tokens: int,
    curve: tuple[tuple[float, float], ...],
) -> ConfigProfile:
    return ConfigProfile(
        name=name,
        num_gpu=num_gpu,
        prefill=PrefillData(points=prefill),
        decode=DecodeData(kv_tokens=kv_tokens, curves=((1100.0, curve),)),
    )


# tp1: TTFT 0.2 s at ISL 1000 -> 1000 / 0.2 / 1 = 5000 tokens/s/GPU. Decode: ITL <= 45 ms up
# to n = 4 (40 ms; n = 5 interpolates to 50 ms) -> 4 / 0.04 / 1 = 100 tokens/s/GPU.
TP1 = _config(
    "tp1",
    1,
    ((500, 0.1), (1000, 0.2), (2000, 0.5)),
    11000,
    ((1, 0.02), (2, 0.025), (4, 0.04), (8, 0.08)),
)
# tp2: TTFT 0.09 s -> 1000 / 0.09 / 2 = 5555.6 tokens/s/GPU. Decode: n / ITL peaks at n = 8
# (8 / 0.024 = 333.3; n = 9 gives 9 / 0.02725 = 330.3) -> 166.7 tokens/s/GPU.
TP2 = _config(
    "tp2",
    2,
    ((500, 0.05), (1000, 0.09), (2000, 0.2)),
    44000,
    ((1, 0.01), (2, 0.012), (4, 0.016), (8, 0.024), (16, 0.05)),
)


def test_itl_window_skips_tokens_before_all_started() -> None:
    # a's first token came 3 s before its second (b's prefill shared those steps); the
    # window opens at b's first chunk (3.5) and closes at a's last (6.0).
    a = [(0.0, 1), (3.0, 2), (4.0, 3), (5.0, 4), (6.0, 5)]
    b = [(3.5, 1), (4.5, 2), (5.5, 3), (6.5, 4)]
    # a: 4.0..6.0, 2 tokens; b: 3.5..5.5, 2 tokens -> 4 s / 4 tokens
    assert itl_after_all_started([a, b]) == pytest.approx(1.0)


def test_itl_window_counts_merged_chunks_by_their_tokens() -> None:
    # the last chunk carries three tokens: 3 s for 4 tokens
    assert itl_after_all_started([[(0.0, 1), (1.0, 2), (3.0, 5)]]) == pytest.approx(0.75)


def test_itl_window_empty_when_requests_never_ran_together() -> None:
    assert itl_after_all_started([[(0.0, 1), (1.0, 2)], [(2.0, 1), (3.0, 2)]]) is None
    assert itl_after_all_started([[(0.0, 1), (1.0, 2)], []]) is None
    assert itl_after_all_started([]) is None


def test_measuring_plan() -> None:
    # 4500 and 6000 do not fit a 4096-token context: both become 4095
    assert isl_sweep(3000, ISL_FACTORS, 4096) == (375, 750, 1500, 3000, 4095)
    # P = factor * context - 64 / 2, at most 4096 - 64
    assert decode_prompt_lengths(3000, (0.5, 1, 1.5), 64, 4096) == (1468, 2968, 4032)
    assert decode_prompt_lengths(3000, (1,), 64, 64) == ()
    assert fits_in_flight(1024, 128, 300) == 341  # 3 blocks each
    assert in_flight_grid(8) == (1, 2, 4, 8)
    assert in_flight_grid(10) == (1, 2, 4, 8, 10)
    assert in_flight_grid(1) == (1,)
    assert in_flight_grid(0) == ()


def test_each_role_takes_its_best_throughput_per_gpu() -> None:
    rec = recommend(SLA, [TP1, TP2])
    assert [p.throughput_per_gpu for p in rec.prefill_points] == pytest.approx(
        [5000, 1000 / 0.09 / 2]
    )
    assert rec.prefill.config == "tp2" and rec.prefill.meets
    tp1, tp2 = rec.decode_points
    assert (tp1.in_flight, tp1.itl, tp1.throughput_per_gpu) == (4, pytest.approx(0.04), 100)
    assert tp1.kv_utilisation == pytest.approx(4 * 1100 / 11000)
    assert (tp2.in_flight, tp2.itl) == (8, pytest.approx(0.024))
    assert tp2.throughput_per_gpu == pytest.approx(8 / 0.024 / 2)
    assert rec.decode.config == "tp2" and rec.decode.meets


def test_thresholds_from_the_chosen_configs() -> None:
    t = recommend(SLA, [TP1, TP2]).thresholds
    # (0.5 - 0.09) / 0.09 = 41 / 9 queued prefills per worker; lower 0.4 of it
    assert t.prefill_queue_upper == pytest.approx(41 / 9)
    assert t.prefill_queue_lower == pytest.approx(0.4 * 41 / 9)
    # 8 in flight x 1100 tokens / 44000 = 0.2; lower half of it
    assert t.decode_kv_upper == pytest.approx(0.2)
    assert t.decode_kv_lower == pytest.approx(0.1)


def test_thresholds_are_clipped() -> None:
    fast = PrefillPoint("a", 1, ttft=0.01, throughput_per_gpu=1.0, meets=True)
    slow = PrefillPoint("a", 1, ttft=1.0, throughput_per_gpu=1.0, meets=False)
    full = DecodePoint("a", 1, 100, 0.01, 1.0, kv_utilisation=0.97, meets=True)
    unknown = DecodePoint("a", 1, 100, 0.01, 1.0, kv_utilisation=None, meets=True)
    assert thresholds(SLA, fast, full).prefill_queue_upper == 5.0  # 49 clipped
    t = thresholds(SLA, slow, full)
    assert (t.prefill_queue_upper, t.decode_kv_upper) == (0.1, 0.9)  # -0.5 and 0.97 clipped
    t = thresholds(SLA, fast, unknown)
    assert t.decode_kv_upper is None and t.decode_kv_lower is None


def test_choice_never_rests_on_extrapolated_itl() -> None:
    # The KV holds 40 at L = 1100, but only 1 and 2 were measured: extrapolating the line
    # would reach 45 ms at n = 36 and choose it.
    flat = _config("flat", 1, ((1000, 0.1),), 44000, ((1, 0.01), (2, 0.011)))
    assert recommend(SLA, [flat]).decode.in_flight == 2


def test_closest_config_when_no_sla_is_met() -> None:
    strict = SlaTarget(isl=1000, osl=200, ttft=0.01, itl=0.005)
    rec = recommend(strict, [TP1, TP2])
    assert (rec.prefill.config, rec.prefill.meets) == ("tp2", False)  # lowest TTFT
    assert (rec.decode.config, rec.decode.in_flight, rec.decode.meets) == ("tp2", 1, False)
    lines = report_lines(strict, rec)
    assert any(line.startswith("WARNING: no configuration meets the TTFT SLA") for line in lines)
    assert any(line.startswith("WARNING: no configuration meets the ITL SLA") for line in lines)


def test_report_lines() -> None:
    lines = report_lines(SLA, recommend(SLA, [TP1, TP2]))
    assert lines[2:] == [
        "Suggested prefill config: tp2 (TTFT 90.0 ms, throughput 5556 tokens/s/GPU)",
        "Suggested planner upper/lower bound for prefill queue size: 4.56/1.82",
        "Suggested decode config: tp2 (ITL 24.00 ms at 8 in flight, throughput 167 tokens/s/GPU)",
        "Suggested planner upper/lower bound for decode kv cache utilization: 0.20/0.10",
    ]
    assert lines[0].startswith("tp1 (1 GPU): TTFT 200.0 ms at ISL 1000")


def test_nothing_profiled_is_refused() -> None:
    with pytest.raises(ValueError, match="no configuration"):
        recommend(SLA, [])
