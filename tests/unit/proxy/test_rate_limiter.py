"""The rate limiter around the buckets: what a request is charged, what its answer says, and
the correction its usage makes."""

from __future__ import annotations

import pytest

from fleet.clock import FakeClock
from flowcontrol.config import RateLimitsConfig
from flowcontrol.rate_table import RateTable
from proxy.errors import ProxyError
from proxy.ports import FinishedRequest
from proxy.serving.rate_limiter import RateLimiter, usage


def finished(answer: bytes | None, completion: int | None, prompt: int = 10) -> FinishedRequest:
    return FinishedRequest("m", answer is None, ["b"], 1, 0, 0.1, prompt, answer, completion)


def limiter(clock: FakeClock) -> RateLimiter:
    config = RateLimitsConfig.model_validate(
        {"default": {"tokens_per_minute": 600}, "tenants": {"free": {}}}
    )
    return RateLimiter(config, RateTable(rows=16), clock)


def test_usage_from_a_whole_answer_or_a_tracked_stream() -> None:
    answer = b'{"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 30}}'
    assert usage(finished(answer, None)) == 37
    assert usage(finished(None, 20, prompt=12)) == 32
    assert usage(finished(b'{"choices": []}', None)) is None  # no usage: the estimate stays
    assert usage(finished(None, None)) is None
    assert usage(None) is None


def test_charged_the_estimate_then_its_usage() -> None:
    clock = FakeClock()
    rates = limiter(clock)
    charge = rates.admit("t", 100)
    assert charge is not None and charge.tokens == 100
    assert (b"x-ratelimit-remaining-tokens", b"500") in charge.headers
    assert not any(name.endswith(b"-requests") for name, _ in charge.headers)
    answer = b'{"usage": {"prompt_tokens": 100, "completion_tokens": 450}}'
    rates.settle("t", charge, finished(answer, None))
    with pytest.raises(ProxyError) as refused:
        rates.admit("t", 100)  # 50 left
    e = refused.value
    assert e.status == 429 and e.type == "tokens" and e.code == "rate_limit_exceeded"
    assert (b"retry-after", b"5") in e.headers  # 50 tokens short at 10 a second
    clock.advance(5.0)
    assert rates.admit("t", 100) is not None


def test_a_tenant_whose_entry_names_no_limit_is_not_limited() -> None:
    rates = limiter(FakeClock())
    assert rates.admit("free", 10_000) is None
