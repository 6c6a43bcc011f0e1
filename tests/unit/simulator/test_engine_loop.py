"""The engine's step loop on a manual clock: no sleeping, timings in engine seconds."""

import pytest
from prometheus_client.parser import text_string_to_metric_families

from simulator.engine import Engine
from simulator.request import GenerationParams, SimRequest
from simulator.simtime import ManualTime
from simulator.tokenizer import Tokenizer
from tests.unit.simulator.conftest import small_profile


async def _drain(req: SimRequest) -> list[int]:
    seen: list[int] = []
    while True:
        ev = await req.stream.get()
        seen.extend(ev.token_ids)
        if ev.finish_reason is not None:
            return seen


def _samples(page: bytes) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(page.decode()):
        for s in fam.samples:
            out[s.name] = s.value
    return out


async def test_loop_runs_requests_and_reports_engine_seconds(tokenizer: Tokenizer) -> None:
    clock = ManualTime(start=100.0)
    engine = Engine(
        profile=small_profile(), tokenizer=tokenizer, time=clock, model_name="m", engine_id="e0"
    )
    engine.start()
    try:
        req = engine.new_request("r1", list(range(10, 22)), GenerationParams(max_tokens=3))
        engine.submit(req)
        tokens = await _drain(req)
    finally:
        await engine.stop()
    assert tokens == req.output_ids and len(tokens) == 3
    # Step 1 prefills 12 tokens (0.01 + 0.012 s); steps 2-3 decode one token each (0.011 s).
    assert req.first_token_at == pytest.approx(100.022)
    assert req.finished_at == pytest.approx(100.044)
    m = _samples(engine.metrics.render(engine.core))
    assert m["vllm:time_to_first_token_seconds_sum"] == pytest.approx(0.022)
    assert m["vllm:inter_token_latency_seconds_count"] == 2
    assert m["vllm:e2e_request_latency_seconds_sum"] == pytest.approx(0.044)
    assert m["vllm:generation_tokens_total"] == 3
    assert m["vllm:prompt_tokens_total"] == 12
    assert engine.lag_fraction() == 0.0


async def test_slowdown_fault_stretches_steps(tokenizer: Tokenizer) -> None:
    clock = ManualTime()
    engine = Engine(
        profile=small_profile(), tokenizer=tokenizer, time=clock, model_name="m", engine_id="e0"
    )
    engine.faults.apply({"slowdown": 3.0})
    engine.start()
    try:
        req = engine.new_request("r1", list(range(10, 22)), GenerationParams(max_tokens=1))
        engine.submit(req)
        await _drain(req)
    finally:
        await engine.stop()
    assert req.first_token_at == pytest.approx(3 * 0.022)


async def test_reset_forgets_requests_and_cache(tokenizer: Tokenizer) -> None:
    engine = Engine(
        profile=small_profile(),
        tokenizer=tokenizer,
        time=ManualTime(),
        model_name="m",
        engine_id="e0",
    )
    req = engine.new_request("r1", [1, 2, 3], GenerationParams(max_tokens=5))
    engine.submit(req)
    engine.reset()
    assert req.finish_reason == "abort"
    assert not engine.core.requests and engine.core.pool.usage() == 0.0


class LateTime(ManualTime):
    """Every wake-up comes `late_by` engine seconds after the time asked for."""

    def __init__(self, late_by: float) -> None:
        super().__init__(0.0)
        self.late_by = late_by

    async def sleep_until(self, t: float) -> None:
        await super().sleep_until(t)
        self.advance(self.late_by)


async def _timed_run(tokenizer: Tokenizer, clock: ManualTime) -> tuple[Engine, SimRequest]:
    engine = Engine(
        profile=small_profile(), tokenizer=tokenizer, time=clock, model_name="m", engine_id="e0"
    )
    engine.start()
    try:
        req = engine.new_request("r1", list(range(10, 22)), GenerationParams(max_tokens=20))
        engine.submit(req)
        await _drain(req)
    finally:
        await engine.stop()
    return engine, req


async def test_late_wake_ups_are_made_up_not_accumulated(tokenizer: Tokenizer) -> None:
    engine, req = await _timed_run(tokenizer, LateTime(late_by=0.002))
    # Prefill 0.022 s, then 19 decode steps of 0.011 s: the timeline of an on-time engine.
    assert req.first_token_at == pytest.approx(0.022)
    assert req.finished_at == pytest.approx(0.022 + 19 * 0.011)
    assert engine.lag_fraction() < 0.02


async def test_an_engine_too_far_behind_carries_on_and_shows_lag(tokenizer: Tokenizer) -> None:
    engine, req = await _timed_run(tokenizer, LateTime(late_by=1.5))  # past the 1 s catch-up
    assert req.finished_at is not None and req.finished_at > 1.5
    assert engine.lag_fraction() > 0.9
