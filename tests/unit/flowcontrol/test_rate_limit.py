"""The rate limits' buckets (flowcontrol/rate_limit.py) and the table that holds them."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from flowcontrol.rate_limit import Buckets, Limits, correct, duration, take
from flowcontrol.rate_table import RateTable, create_table_file


def test_requests_per_minute_refill_continuously() -> None:
    limits = Limits(requests=3)
    b: Buckets | None = None
    for left in (2, 1, 0):
        b, v = take(b, limits, 100.0, 10)
        assert v.allowed and v.requests is not None and v.requests.remaining == left
        assert v.tokens is None
    b, v = take(b, limits, 100.0, 10)
    assert not v.allowed and v.exceeded == "requests"
    assert v.retry_after == pytest.approx(20.0)  # one request back every 20 s
    assert v.requests is not None and v.requests.reset == pytest.approx(60.0)
    b, v = take(b, limits, 119.0, 10)
    assert not v.allowed
    b, v = take(b, limits, 120.0, 10)
    assert v.allowed


def test_tokens_charged_up_front_and_corrected_by_usage() -> None:
    limits = Limits(tokens=1000)
    b, v = take(None, limits, 0.0, 400)
    assert v.allowed and v.tokens is not None and v.tokens.remaining == 600
    b = correct(b, limits, 0.0, 700 - 400)  # usage said 700
    b, v = take(b, limits, 0.0, 400)
    assert not v.allowed and v.exceeded == "tokens"
    assert v.tokens is not None and v.tokens.remaining == 300
    assert v.retry_after == pytest.approx(100 * 60 / 1000)
    b = correct(b, limits, 0.0, -5000)  # refunds stop at a full bucket
    assert b.tokens == 1000


def test_a_prompt_over_the_whole_limit_passes_on_a_full_bucket_into_debt() -> None:
    limits = Limits(tokens=100)
    b, v = take(None, limits, 0.0, 250)
    assert v.allowed and b.tokens == -150
    assert v.tokens is not None and v.tokens.remaining == 0
    _, v = take(b, limits, 60.0, 10)
    assert not v.allowed  # 160 s of debt and the 10 asked


def test_refused_takes_nothing() -> None:
    limits = Limits(requests=1, tokens=100)
    b, _ = take(None, limits, 0.0, 90)
    b2, v = take(b, limits, 0.0, 5)
    assert not v.allowed and b2 == b


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.0201, "21ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (360.0, "6m0s"),
        (3723.0, "1h2m3s"),
    ],
)
def test_openai_duration_format(seconds: float, text: str) -> None:
    assert duration(seconds) == text


def test_table_keeps_tenants_apart_and_survives_a_full_table() -> None:
    table = RateTable(rows=8)
    limits = Limits(requests=1)
    for t in range(20):  # more tenants than rows: the oldest rows are taken over
        assert table.update(f"t{t}", lambda b, t=t: take(b, limits, float(t), 0)).allowed
    assert not table.update("t19", lambda b: take(b, limits, 19.0, 0)).allowed


def _charge(path: str, n: int) -> None:
    table = RateTable(path)
    limits = Limits(tokens=1_000_000)
    for _ in range(n):
        table.update("shared", lambda b: take(b, limits, 0.0, 1))
    table.close()


def test_table_file_charges_are_atomic_across_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "rates")
    create_table_file(path)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_charge, args=(path, 500)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    table = RateTable(path)
    left = table.update("shared", lambda b: (b, b))
    assert left is not None and left.tokens == 1_000_000 - 1500
