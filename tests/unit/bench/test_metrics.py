import math

import pytest

from bench.metrics import derive, distribution
from bench.records import RequestRecord
from bench.summary import balance, meets_slo, parse_slo, summarize


def test_derive_on_hand_made_timings() -> None:
    # Sent at 10.0; content at 10.2, 10.3, 10.5, 10.6; stream ends at 10.7; 4 tokens.
    d = derive(10.0, [10.2, 10.3, 10.5, 10.6], 10.7, 4)
    assert d.ttft == pytest.approx(0.2)
    assert d.itls == pytest.approx([0.1, 0.2, 0.1])
    assert d.e2e == pytest.approx(0.7)
    assert d.tpot == pytest.approx((0.7 - 0.2) / 3)


def test_tpot_uses_usage_tokens_not_chunks() -> None:
    # Two chunks carrying 9 tokens: TPOT divides by 8, ITL has one gap.
    d = derive(0.0, [1.0, 2.0], 2.6, 9)
    assert d.tpot == pytest.approx(1.6 / 8)
    assert d.itls == pytest.approx([1.0])


def test_derive_edge_cases() -> None:
    one = derive(0.0, [0.5], 0.6, 1)
    assert one.ttft == pytest.approx(0.5) and one.tpot is None and one.itls == []
    none = derive(0.0, [], 0.3, 0)
    assert none.ttft is None and none.e2e == pytest.approx(0.3)


def test_distribution_percentiles() -> None:
    d = distribution([float(x) for x in range(1, 101)])
    assert d["mean"] == pytest.approx(50.5)
    assert d["p50"] == pytest.approx(50.5)
    assert d["p90"] == pytest.approx(90.1)
    assert d["p99"] == pytest.approx(99.01)
    assert distribution([])["p50"] is None


def rec(
    *,
    sent: float,
    ttft: float | None,
    e2e: float,
    out: int,
    backend: str = "b1",
    error: str | None = None,
    prompt: int = 100,
) -> RequestRecord:
    tpot = (e2e - ttft) / (out - 1) if ttft is not None and out > 1 else None
    return RequestRecord(
        setting="A",
        repeat=0,
        session_id="s",
        turn=0,
        call=0,
        scheduled_s=sent,
        sent_s=sent,
        est_prompt_tokens=prompt,
        ttft_s=ttft,
        e2e_s=e2e,
        tpot_s=tpot,
        itl_s=[tpot] * (out - 1) if tpot else [],
        prompt_tokens=prompt,
        completion_tokens=out,
        usage_reported=True,
        backend=backend,
        error=error,
    )


def test_parse_slo_converts_ms_and_rejects_unknown() -> None:
    assert parse_slo(["ttft:500", "tpot:50"]) == {"ttft": 0.5, "tpot": 0.05}
    for bad in (["latency:5"], ["ttft"], ["ttft:-1"]):
        with pytest.raises(ValueError):
            parse_slo(bad)


def test_meets_slo() -> None:
    slo = {"ttft": 0.5, "tpot": 0.1}
    assert meets_slo(rec(sent=0, ttft=0.4, e2e=1.3, out=10), slo)  # tpot 0.1
    assert not meets_slo(rec(sent=0, ttft=0.6, e2e=1.0, out=10), slo)
    assert not meets_slo(rec(sent=0, ttft=0.1, e2e=2.0, out=10), slo)  # tpot 0.21
    assert meets_slo(rec(sent=0, ttft=0.1, e2e=0.1, out=1), slo)  # no decode, no TPOT
    assert not meets_slo(rec(sent=0, ttft=None, e2e=0.1, out=0, error="http 500"), slo)


def test_summary_throughput_goodput_and_attainment() -> None:
    records = [
        rec(sent=0.0, ttft=0.1, e2e=1.0, out=10, backend="b1"),  # meets
        rec(sent=1.0, ttft=0.9, e2e=2.0, out=10, backend="b2"),  # ttft misses
        rec(sent=2.0, ttft=0.2, e2e=2.0, out=5, backend="b1"),  # meets; ends at 4.0
        rec(sent=3.0, ttft=None, e2e=0.5, out=0, error="timeout", backend="b2"),
    ]
    s = summarize(records, {"ttft": 0.5})
    assert s["requests"] == 4 and s["completed"] == 3 and s["errors"] == 1
    assert s["error_kinds"] == {"timeout": 1}
    assert s["duration_s"] == pytest.approx(4.0)
    assert s["throughput"]["requests_per_s"] == pytest.approx(3 / 4)
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(25 / 4)
    assert s["slo"]["met"] == 2
    assert s["slo"]["attainment"] == pytest.approx(0.5)
    assert s["slo"]["goodput_rps"] == pytest.approx(2 / 4)
    assert s["ttft_ms"]["p50"] == pytest.approx(200.0)
    assert s["e2e_ms"]["n"] == 3


def test_balance_counts_idle_backends() -> None:
    records = [rec(sent=0, ttft=0.1, e2e=0.2, out=2, backend="b1", prompt=10)] * 3 + [
        rec(sent=0, ttft=0.1, e2e=0.2, out=2, backend="b2", prompt=10)
    ]
    b = balance(records, backends=["b1", "b2", "b3"])
    assert b["backends"]["b1"]["requests"] == 3
    assert b["backends"]["b1"]["share"] == pytest.approx(0.75)
    assert b["backends"]["b3"]["requests"] == 0
    assert b["requests_max_over_min"] is None  # b3 got nothing: the ratio is undefined
    b2 = balance(records)
    assert b2["requests_max_over_min"] == pytest.approx(3.0)
    assert b2["tokens_max_over_min"] == pytest.approx(3.0)
    assert b2["requests_cv"] == pytest.approx(0.5)
    assert math.isclose(b2["backends"]["b2"]["prompt_tokens"], 10)


def test_balance_without_backend_headers_attributes_nothing() -> None:
    records = [rec(sent=0, ttft=0.1, e2e=0.2, out=2, backend="")] * 2
    records[0].backend = records[1].backend = None
    b = balance(records, backends=["b1", "b2"])
    assert b["backends"] == {} and b["requests_max_over_min"] is None
