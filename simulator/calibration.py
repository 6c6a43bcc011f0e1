"""What a profile predicts for one request alone on an idle engine: the figures a real
engine's TTFT / TPOT captures (tests/golden/vllm-0.32/timings.json) are compared with."""

from __future__ import annotations

from dataclasses import dataclass

from simulator.core import EngineCore
from simulator.lm import DeterministicLM
from simulator.profiles import Profile
from simulator.request import GenerationParams, SimRequest
from simulator.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Timing:
    ttft_s: float
    tpot_s: float


def _run_alone(
    core: EngineCore,
    lm: DeterministicLM,
    rid: str,
    prompt: list[int],
    output_tokens: int,
    now: float,
) -> tuple[SimRequest, float]:
    req = SimRequest(
        rid,
        prompt,
        GenerationParams(max_tokens=output_tokens, ignore_eos=True),
        arrival=now,
        lm_state=lm.context_state(prompt),
        ready_at=now + core.profile.request_overhead_s,
    )
    core.add_request(req)
    now = req.ready_at
    while not req.finished:
        step = core.schedule(now)
        assert step is not None, "an idle engine must schedule a ready request"
        now += step.duration
        core.finish_step(step, now)
    return req, now


def predict(
    profile: Profile,
    tokenizer: Tokenizer,
    prompt_tokens: int,
    output_tokens: int,
    cached_prefix_tokens: int = 0,
) -> Timing:
    """TTFT and TPOT of a request of `prompt_tokens` whose first `cached_prefix_tokens` were
    sent just before (so they sit in the prefix cache)."""
    lm = DeterministicLM(tokenizer.generatable, 0.0)
    core = EngineCore(profile, tokenizer, lm)
    prompt = [tokenizer.generatable[i % len(tokenizer.generatable)] for i in range(prompt_tokens)]
    now = 0.0
    if cached_prefix_tokens:
        _req, now = _run_alone(core, lm, "warm", prompt[:cached_prefix_tokens], 1, now)
    req, _ = _run_alone(core, lm, "probe", prompt, output_tokens, now)
    assert req.first_token_at is not None and req.finished_at is not None
    ttft = req.first_token_at - req.arrival
    tpot = (req.finished_at - req.first_token_at) / max(1, output_tokens - 1)
    return Timing(ttft, tpot)
