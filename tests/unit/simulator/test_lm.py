from simulator.lm import DeterministicLM
from simulator.tokenizer import EOS_ID, Tokenizer


def _generate(lm: DeterministicLM, context: list[int], n: int) -> list[int]:
    state = lm.context_state(context)
    out = []
    for _ in range(n):
        t = lm.next_token(state)
        out.append(t)
        state = lm.push(state, t)
    return out


def test_same_context_same_tokens_and_different_context_differs(tokenizer: Tokenizer) -> None:
    lm = DeterministicLM(tokenizer.generatable)
    a = _generate(lm, [1, 2, 3], 30)
    assert a == _generate(DeterministicLM(tokenizer.generatable), [1, 2, 3], 30)
    assert a != _generate(lm, [1, 2, 4], 30)
    assert len(set(a)) > 20  # not a degenerate repetition


def test_continuation_from_any_prefix_of_the_output(tokenizer: Tokenizer) -> None:
    lm = DeterministicLM(tokenizer.generatable)
    prompt = tokenizer.encode("Once upon a time", add_bos=True)
    full = _generate(lm, prompt, 40)
    for k in (1, 8, 25):
        assert _generate(lm, prompt + full[:k], 40 - k) == full[k:]


def test_eos_rate_follows_the_configured_probability(tokenizer: Tokenizer) -> None:
    lm = DeterministicLM(tokenizer.generatable, eos_probability=0.05)
    n = 20_000
    eos = sum(lm.next_token(lm.context_state([i, 7])) == EOS_ID for i in range(n))
    assert 0.04 * n < eos < 0.06 * n
    never = DeterministicLM(tokenizer.generatable, eos_probability=0.0)
    assert all(never.next_token(never.context_state([i])) != EOS_ID for i in range(2000))
