"""The latency predictor and the headroom rules, as pure functions, against hand-computed
values (policies/latency.py, policies/headroom.py)."""

from __future__ import annotations

import pytest

from fleet.types import EngineMetrics
from policies.headroom import misses, relative_scores, slo_scores
from policies.latency import (
    Prediction,
    Rates,
    Slo,
    Speed,
    fill_unobserved,
    observed_rates,
    parse_slo,
    predict,
)

PREV = EngineMetrics(
    prefill_computed_sum=1000,
    prefill_computed_count=4,
    prefill_time_sum=0.5,
    prefill_time_count=4,
    itl_sum=1.0,
    itl_count=100,
    steps=200,
    generation_tokens=400,
)
CUR = EngineMetrics(
    prefill_computed_sum=3000,
    prefill_computed_count=6,
    prefill_time_sum=0.75,
    prefill_time_count=6,
    itl_sum=1.6,
    itl_count=120,
    steps=210,
    generation_tokens=440,
)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "50"}, Slo(0.5, 0.05)),
        ({"x-slo-ttft-ms": "250.5"}, Slo(0.2505, None)),
        ({"x-slo-tpot-ms": "abc", "x-slo-ttft-ms": "0"}, Slo(None, None)),
        ({"x-slo-ttft-ms": "-5", "x-slo-tpot-ms": "inf"}, Slo(None, None)),
        ({}, Slo(None, None)),
    ],
)
def test_parse_slo(headers: dict[str, str], expected: Slo) -> None:
    slo = parse_slo(headers)
    assert slo == expected
    assert bool(slo) == (expected.ttft_s is not None or expected.tpot_s is not None)


def test_rates_of_the_last_scrape_interval() -> None:
    r = observed_rates(CUR, PREV)
    assert r.prefill_tokens_per_s == pytest.approx(2000 / 0.25)  # 8000
    assert r.tokens_per_request == pytest.approx(2000 / 2)
    assert r.itl_s == pytest.approx(0.6 / 20)
    assert r.itl_batch == pytest.approx(40 / 10)


def test_an_interval_without_samples_falls_back_to_the_engines_life() -> None:
    r = observed_rates(CUR, CUR)
    assert r.prefill_tokens_per_s == pytest.approx(3000 / 0.75)
    assert r.tokens_per_request == pytest.approx(500)
    assert r.itl_s == pytest.approx(1.6 / 120)
    assert r.itl_batch == pytest.approx(440 / 210)
    # a restarted engine (counters below the previous scrape's) is read over its new life
    assert observed_rates(PREV, CUR).prefill_tokens_per_s == pytest.approx(1000 / 0.5)


def test_an_engine_without_traffic_has_no_observations() -> None:
    assert observed_rates(EngineMetrics(), None) == Rates(None, None, 1.0, None)


def test_an_engine_without_the_computed_tokens_histogram_uses_prompts_over_ttft() -> None:
    older = EngineMetrics(prompt_len_sum=2000, prompt_len_count=4, ttft_sum=0.5, ttft_count=4)
    r = observed_rates(older, None)
    assert (r.prefill_tokens_per_s, r.tokens_per_request) == (4000.0, 500.0)


def test_unobserved_rates_take_the_peers_median_else_the_defaults() -> None:
    rates = [
        Rates(4000.0, 0.02, 2.0, 500.0),
        Rates(None, None, 1.0, None),
        Rates(8000.0, 0.04, 1.0, 1500.0),
    ]
    filled = fill_unobserved(rates, 1000.0, 0.1, 77.0)
    assert filled[0] == Speed(4000.0, 0.02, 2.0, 500.0)
    # the borrowed ITL keeps the batch it was observed at: median of 2 and 1
    assert filled[1] == Speed(6000.0, 0.03, 1.5, 1000.0)
    assert fill_unobserved([Rates(None, None, 1.0, None)], 1000.0, 0.1, 77.0) == [
        Speed(1000.0, 0.1, 1.0, 77.0)
    ]


@pytest.mark.parametrize(("share", "tpot"), [(0.25, 0.03), (1.0, 0.06), (0.0, 0.02)])
def test_predict(share: float, tpot: float) -> None:
    speed = Speed(prefill_tokens_per_s=4000.0, itl_s=0.02, itl_batch=2.0, tokens_per_request=500)
    # queued = max(1000 pending, 3 waiting x 500) = 1500; TTFT = (1500 + 600) / 4000
    # batch after joining = 5 + 1 = 6, 3x the observed 2: TPOT = 0.02 x ((1 - s) + 3 s)
    p = predict(speed, 1000, 3, 5, 600, share)
    assert p.ttft_s == pytest.approx(0.525)
    assert p.tpot_s == pytest.approx(tpot)


PREDS = [Prediction(0.2, 0.02), Prediction(0.4, 0.05), Prediction(0.6, 0.03)]


def test_headroom_scores_most() -> None:
    # TTFT SLO 0.5: headroom 0.6, 0.2, -0.2; TPOT SLO 0.04: 0.5, -0.25, 0.25
    scores = slo_scores(PREDS, Slo(0.5, 0.04), 1.0, 1.0, "most")
    assert scores == pytest.approx([0.55, 0.1, 0.125])
    weighted = slo_scores(PREDS, Slo(0.5, 0.04), 0.8, 0.2, "most")
    assert weighted == pytest.approx([0.58, 0.16, 0.05])


def test_headroom_scores_least_prefer_the_tightest_fit_that_meets() -> None:
    scores = slo_scores(PREDS, Slo(0.5, 0.04), 1.0, 1.0, "least")
    assert scores == pytest.approx([0.45, 0.4, 0.375])


def test_only_the_objectives_the_request_carries_count() -> None:
    assert slo_scores(PREDS, Slo(0.5, None), 1.0, 1.0) == pytest.approx([0.6, 0.2, 0.0])
    # a carried objective whose weight is 0 still decides when it is the only one
    assert slo_scores(PREDS, Slo(None, 0.04), 1.0, 0.0) == pytest.approx([0.5, 0.0, 0.25])


def test_without_an_slo_lower_predictions_score_higher() -> None:
    # TTFT inverse min-max 1, 0.5, 0; TPOT 1, 0, 2/3
    assert relative_scores(PREDS, 1.0, 1.0) == pytest.approx([1.0, 0.25, 1 / 3])
    assert relative_scores([Prediction(0.1, 0.01)] * 2, 1.0, 1.0) == [1.0, 1.0]


def test_misses_count_the_objectives_predicted_to_be_missed() -> None:
    slo = Slo(0.5, 0.04)
    assert [misses(p, slo) for p in PREDS] == [0, 1, 1]
    assert misses(Prediction(0.9, 0.09), slo) == 2
    assert misses(Prediction(0.5, 0.04), slo) == 0  # exactly at the SLO meets it
    assert misses(Prediction(9.0, 9.0), Slo()) == 0
