"""The engine model: batching under a token budget, block accounting, prefix caching,
eviction, preemption, stop conditions and the P/D hold, all on a fake clock."""

import pytest

from simulator.request import GenerationParams, SimRequest, Status
from simulator.tokenizer import EOS_ID, Tokenizer
from tests.unit.simulator.conftest import CoreHarness


def _alone(tokenizer: Tokenizer, prompt: list[int], max_tokens: int) -> list[int]:
    h = CoreHarness(tokenizer, num_gpu_blocks=256)
    req = h.request(prompt, max_tokens)
    h.run()
    return req.output_ids


def test_step_takes_running_decodes_then_chunked_prefill_under_budget(
    harness: CoreHarness,
) -> None:
    a = harness.request(list(range(10, 22)), max_tokens=3)
    b = harness.request(list(range(30, 42)), max_tokens=3)
    first = harness.step()
    assert [(r, n) for r, n in first] == [(a, 12), (b, 4)]  # budget 16: b is chunked
    assert len(a.output_ids) == 1 and not b.output_ids
    second = harness.step()
    assert [(r, n) for r, n in second] == [(a, 1), (b, 8)]
    assert len(a.output_ids) == 2 and len(b.output_ids) == 1


def test_step_duration_follows_the_profile(harness: CoreHarness) -> None:
    harness.request(list(range(10, 22)), max_tokens=2)
    step = harness.core.schedule(0.0)
    assert step is not None
    assert step.duration == pytest.approx(0.01 + 12 * 0.001)


def test_max_num_seqs_caps_the_running_batch(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, max_num_seqs=2, max_num_batched_tokens=100, num_gpu_blocks=64)
    reqs = [h.request([i, i + 1, i + 2], max_tokens=5) for i in range(3)]
    h.step()
    assert [r.status for r in reqs] == [Status.RUNNING, Status.RUNNING, Status.WAITING]
    h.run()
    assert all(len(r.output_ids) == 5 and r.finish_reason == "length" for r in reqs)


def test_blocks_grow_with_tokens_and_all_return_when_done(harness: CoreHarness) -> None:
    req = harness.request(list(range(10, 17)), max_tokens=6)  # 7 prompt tokens
    harness.step()
    assert len(req.blocks) == 2  # 7 tokens computed, room for 8
    harness.run()
    assert req.finish_reason == "length" and len(req.output_ids) == 6
    assert harness.core.pool.num_free == harness.profile.num_gpu_blocks
    assert harness.core.pool.usage() == 0.0


def test_abort_frees_blocks_at_once(harness: CoreHarness) -> None:
    req = harness.request(list(range(10, 30)), max_tokens=50)
    harness.step()
    assert harness.core.pool.usage() > 0
    assert harness.core.abort(req.request_id)
    assert req.finish_reason == "abort" and req.blocks == []
    assert harness.core.pool.usage() == 0.0
    assert not harness.core.has_work()
    assert not harness.core.abort(req.request_id)


def test_second_request_with_same_prefix_hits_full_blocks(harness: CoreHarness) -> None:
    prompt = list(range(100, 112))  # 12 tokens = 3 full blocks of 4
    first = harness.request(prompt, max_tokens=2)
    harness.run()
    second = harness.request([*prompt, 7, 8], max_tokens=2)
    harness.step()
    assert second.prefix_hit_tokens == 12
    c = harness.core.counters
    assert c.prefix_queries == 12 + 14 and c.prefix_hits == 12
    harness.run()
    assert first.output_ids != second.output_ids  # different contexts


def test_full_prompt_hit_still_computes_the_last_token(harness: CoreHarness) -> None:
    prompt = list(range(200, 208))  # exactly 2 blocks
    harness.request(prompt, max_tokens=1)
    harness.run()
    again = harness.request(prompt, max_tokens=1)
    chunks = harness.step()
    assert again.prefix_hit_tokens == 4  # one block kept back so one token is computed
    assert chunks == [(again, 4)]


@pytest.mark.parametrize(("other_prompt_len", "surviving_hit"), [(20, 4), (21, 0)])
def test_eviction_drops_cached_prefix_tail_first(
    tokenizer: Tokenizer, other_prompt_len: int, surviving_hit: int
) -> None:
    h = CoreHarness(tokenizer, num_gpu_blocks=6, max_num_batched_tokens=64)
    old = list(range(300, 308))  # 2 blocks, cached once finished
    h.request(old, max_tokens=1)
    h.run()
    assert h.core.pool.num_cached == 2
    # 5 blocks evict the old prompt's last block only; 6 blocks evict both.
    h.request(list(range(400, 400 + other_prompt_len)), max_tokens=1)
    h.run()
    probe = h.request([*old, 1], max_tokens=1)
    h.step()
    assert probe.prefix_hit_tokens == surviving_hit


def test_preemption_by_recompute_keeps_outputs_identical(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, num_gpu_blocks=12, max_num_batched_tokens=64)
    prompts = [list(range(k * 50, k * 50 + 12)) for k in range(4)]
    reqs = [h.request(p, max_tokens=14) for p in prompts]
    h.run()
    assert h.core.counters.preemptions > 0
    assert any(r.num_preemptions for r in reqs)
    for p, r in zip(prompts, reqs, strict=True):
        assert r.output_ids == _alone(tokenizer, p, 14)
    assert h.core.pool.num_free == 12


def test_eos_stops_unless_ignored(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, eos_probability=1.0)
    stopped = h.request([5, 6, 7], max_tokens=5)
    ignored = h.request([5, 6, 8], max_tokens=5, ignore_eos=True)
    h.run()
    assert stopped.output_ids == [EOS_ID] and stopped.finish_reason == "stop"
    assert ignored.output_ids == [EOS_ID] * 5 and ignored.finish_reason == "length"


def test_stop_token_and_stop_string(tokenizer: Tokenizer) -> None:
    prompt = [9, 10, 11]
    full = _alone(tokenizer, prompt, 8)
    h = CoreHarness(tokenizer, num_gpu_blocks=256)
    by_id = h.request(prompt, max_tokens=8, stop_token_ids=(full[2],))
    text = [tokenizer.token_str(t) for t in full]
    word = text[3].strip()
    assert word not in "".join(text[:3])
    by_str = h.request(prompt, max_tokens=8, stop=(word,))
    h.run()
    assert by_id.output_ids == full[:3] and by_id.stop_reason == full[2]
    assert by_str.finish_reason == "stop" and by_str.stop_reason == word
    assert by_str.output_text == "".join(text[:3]) + text[3][: text[3].index(word)]


def test_max_model_len_ends_generation(tokenizer: Tokenizer) -> None:
    h = CoreHarness(tokenizer, max_model_len=10)
    req = h.request(list(range(20, 28)), max_tokens=50)
    h.run()
    assert req.num_tokens == 10 and req.finish_reason == "length"


def test_prefill_side_holds_blocks_until_read_or_timeout(harness: CoreHarness) -> None:
    req = harness.request(list(range(500, 512)), max_tokens=1)
    req.do_remote_decode = True
    harness.run()
    assert req.finished and req.request_id in harness.core.held
    assert harness.core.pool.usage() > 0
    assert harness.core.release_held(req.request_id) is req
    assert harness.core.pool.usage() == 0.0

    late = harness.request(list(range(600, 612)), max_tokens=1)
    late.do_remote_decode = True
    harness.run()
    assert harness.core.expire_held(harness.now + 1) == 0
    assert harness.core.expire_held(harness.now + harness.core.hold_timeout_s) == 1
    assert harness.core.pool.usage() == 0.0


@pytest.mark.parametrize("pulled", [True, False])
def test_decode_side_skips_prefill_after_pull_or_recomputes(
    tokenizer: Tokenizer, pulled: bool
) -> None:
    prompt = list(range(700, 720))
    expected = _alone(tokenizer, prompt, 6)
    sim = CoreHarness(tokenizer, num_gpu_blocks=64, max_num_batched_tokens=64)
    decode = SimRequest(
        "d1", list(prompt), GenerationParams(max_tokens=6), 0.0, sim.lm.context_state(prompt)
    )
    to_load = sim.core.begin_remote_prefill(decode)
    assert to_load == len(prompt) - 1
    assert sim.core.schedule(0.0) is None  # waits for its KV
    sim.core.finish_remote_prefill(decode, ok=pulled)
    first = sim.step()
    assert first == [(decode, 1 if pulled else len(prompt))]
    sim.run()
    assert decode.output_ids == expected


def _streamed_text(req: SimRequest) -> str:
    text = "".join(ev.text for ev in req.stream._events)
    req.stream._events.clear()
    return text


def test_stop_string_across_tokens_is_never_streamed_in_part(tokenizer: Tokenizer) -> None:
    prompt = [21, 22, 23]
    full = _alone(tokenizer, prompt, 8)
    pieces = [tokenizer.token_str(t) for t in full]
    stop = pieces[3][-2:] + pieces[4][:2]  # spans the 4th and 5th tokens
    expected = "".join(pieces)[: len("".join(pieces[:4])) - 2]
    assert stop not in "".join(pieces[:4])
    h = CoreHarness(tokenizer, num_gpu_blocks=256)
    req = h.request(prompt, max_tokens=8, stop=(stop,))
    streamed = ""
    while not req.finished:
        h.step()
        streamed += _streamed_text(req)
        # What has been sent is never taken back: always a prefix of the final text.
        assert expected.startswith(streamed)
    assert req.finish_reason == "stop" and req.stop_reason == stop
    assert streamed == req.output_text == expected
    assert len(req.output_ids) == 5
