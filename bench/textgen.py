"""Deterministic filler text of a known token length.

The bench estimates tokens as characters / 4 (the usual rule of thumb for English under BPE
tokenizers, and the estimate the simulator and the proxy use by default), so a block of n
tokens is exactly 4*n characters. Text is drawn from common English words so that a real
tokenizer lands near the same ratio.
"""

from __future__ import annotations

import random
from collections import OrderedDict

CHARS_PER_TOKEN = 4

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from it this be are or an which "
    "have has not but had they his her she he we you their there were been one all would "
    "will can more when other into some time than could only two first new after also "
    "most over such many these may then them out about what so up its made like well "
    "just year system data model cache block route server token queue batch load serve "
    "fleet request reply prefix engine memory power light water stone river city paper "
    "table green small large early later under since while where each every both still "
    "never"
)
_WORDS = tuple(_WORD_TEXT.split())


def tokens_for_chars(n_chars: int) -> int:
    return (n_chars + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def estimate_tokens(text: str) -> int:
    return tokens_for_chars(len(text))


def filler(seed: str, tokens: int) -> str:
    """`tokens` * 4 characters of word text, a pure function of `seed`."""
    n_chars = max(0, tokens) * CHARS_PER_TOKEN
    if n_chars == 0:
        return ""
    rng = random.Random(seed)
    # Average word + space is about 4.5 chars, so n_chars / 3 words always suffice.
    words = rng.choices(_WORDS, k=n_chars // 3 + 2)
    return " ".join(words)[:n_chars]


class BlockText:
    """Text of fixed-size token blocks keyed by an id: equal ids give equal text.

    A bounded LRU keeps hot blocks (shared system prompts) from being regenerated; the
    bound keeps a long trace from holding every block it ever saw.
    """

    def __init__(self, block_tokens: int, salt: str = "", capacity: int = 4096) -> None:
        self.block_tokens = block_tokens
        self._salt = salt
        self._capacity = capacity
        self._cache: OrderedDict[int, str] = OrderedDict()

    def block(self, block_id: int) -> str:
        text = self._cache.get(block_id)
        if text is not None:
            self._cache.move_to_end(block_id)
            return text
        text = filler(f"{self._salt}/block/{block_id}", self.block_tokens)
        self._cache[block_id] = text
        if len(self._cache) > self._capacity:
            self._cache.popitem(last=False)
        return text

    def prompt(self, block_ids: list[int], tokens: int) -> str:
        """The first `tokens` tokens of the concatenated blocks."""
        need = tokens * CHARS_PER_TOKEN
        parts: list[str] = []
        have = 0
        for block_id in block_ids:
            if have >= need:
                break
            part = self.block(block_id)
            parts.append(part)
            have += len(part)
        text = "".join(parts)
        if have < need:  # more tokens than blocks cover: pad deterministically
            text += filler(f"{self._salt}/pad/{block_ids[-1] if block_ids else 0}", tokens)
        return text[:need]
