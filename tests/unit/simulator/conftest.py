"""Shared pieces for the simulator's unit tests: one tokenizer (its tables take ~0.5 s) and a
small profile whose cache runs out after a few requests."""

from __future__ import annotations

import pytest

from simulator.core import EngineCore
from simulator.lm import DeterministicLM
from simulator.profiles import Profile, StepTime
from simulator.request import GenerationParams, SimRequest
from simulator.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return Tokenizer()


def small_profile(**overrides: object) -> Profile:
    base = Profile(
        name="unit",
        block_size=4,
        kv_bytes_per_token=1000,
        num_gpu_blocks=16,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_model_len=256,
        step_time=StepTime(
            base_s=0.01, weight_read_s=0.0, per_token_compute_s=0.001, per_context_token_s=0.0
        ),
        kv_transfer_bandwidth_bytes_per_s=1e6,
        eos_probability=0.0,
    )
    return base.with_overrides(**overrides)


class CoreHarness:
    """An EngineCore plus helpers to make requests and run steps on a fake clock."""

    def __init__(
        self, tokenizer: Tokenizer, *, record_kv_events: bool = False, **overrides: object
    ) -> None:
        self.profile = small_profile(**overrides)
        self.lm = DeterministicLM(tokenizer.generatable, self.profile.eos_probability)
        self.core = EngineCore(self.profile, tokenizer, self.lm, record_kv_events=record_kv_events)
        self.now = 0.0
        self._n = 0

    def request(self, prompt: list[int], max_tokens: int = 4, **params: object) -> SimRequest:
        self._n += 1
        req = SimRequest(
            request_id=f"r{self._n}",
            prompt_ids=list(prompt),
            params=GenerationParams(max_tokens=max_tokens, **params),  # type: ignore[arg-type]
            arrival=self.now,
            lm_state=self.lm.context_state(prompt),
        )
        self.core.add_request(req)
        return req

    def step(self) -> list[tuple[SimRequest, int]]:
        step = self.core.schedule(self.now)
        if step is None:
            return []
        self.now += step.duration
        self.core.finish_step(step, self.now)
        return [(r, n) for r, n in step.chunks]

    def run(self, max_steps: int = 1000) -> int:
        steps = 0
        while self.core.has_work() and steps < max_steps:
            self.step()
            steps += 1
        return steps


@pytest.fixture
def harness(tokenizer: Tokenizer) -> CoreHarness:
    return CoreHarness(tokenizer)
