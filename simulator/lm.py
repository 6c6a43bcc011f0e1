"""A deterministic language model: the next token is a function of every token before it.

The context is folded into a 64-bit rolling hash, one multiply-xor per token, so the state after
prompt + k generated tokens is the same whether those k tokens were generated here or were
resubmitted as part of a prompt on another engine. That is the property live migration and
failover rely on: resubmitting prompt + the first k outputs continues with exactly output k+1.
Sampling parameters (temperature, seed) do not change the output: it behaves like greedy
decoding of a fixed model.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simulator.tokenizer import EOS_ID

_MASK = (1 << 64) - 1
_MUL = 0x100000001B3  # the FNV-1a 64-bit prime
_SEED = 0xCBF29CE484222325  # the FNV-1a 64-bit offset basis
_EOS_SCALE = 1 << 32


def _mix(h: int) -> int:
    """splitmix64's finaliser: spreads the rolling hash's bits before they pick a token."""
    h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK
    return h ^ (h >> 31)


class DeterministicLM:
    def __init__(self, generatable: Sequence[int], eos_probability: float = 1 / 200) -> None:
        if not generatable:
            raise ValueError("the model needs at least one generatable token")
        self._tokens = tuple(generatable)
        self._eos_threshold = int(eos_probability * _EOS_SCALE)

    @staticmethod
    def extend(state: int, token_ids: Iterable[int]) -> int:
        h = state
        for t in token_ids:
            h = ((h ^ t) * _MUL) & _MASK
        return h

    @staticmethod
    def push(state: int, token_id: int) -> int:
        return ((state ^ token_id) * _MUL) & _MASK

    def context_state(self, token_ids: Iterable[int]) -> int:
        return self.extend(_SEED, token_ids)

    def next_token(self, state: int) -> int:
        """The token after the context whose rolling hash is `state`; EOS with a small
        probability that depends only on the context."""
        h = _mix(state)
        if (h & 0xFFFFFFFF) < self._eos_threshold:
            return EOS_ID
        return self._tokens[(h >> 32) % len(self._tokens)]
