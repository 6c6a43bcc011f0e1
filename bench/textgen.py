"""Deterministic filler text of a known token length.

The bench estimates tokens as characters / 4 (the usual rule of thumb for English under BPE
tokenizers, and the proxy's default estimate), so a block of n tokens is exactly 4*n
characters; the word mix below makes a real or simulated tokenizer land near that ratio too.
"""

from __future__ import annotations

import random
from collections import OrderedDict

CHARS_PER_TOKEN = 4

# Common English words, each a single token for BPE tokenizers and for the simulator's, so a
# token costs (word length + 1 space) characters. The length classes are drawn with
# probabilities giving a mean word length of 3.0, hence 4.0 characters per token (measured
# with simulator.tokenizer: 4.0 on this text, vs 4.6 for uniform draws over these words).
_WORDS_BY_LENGTH: dict[int, tuple[float, str]] = {
    2: (0.30, "of to in is on it be as by at or an he we so up my me no do go us am if"),
    3: (
        0.45,
        "the and for was are not but had his her she you all one can two new its may out way "
        "day man now old see him how our get use any say own who did yes yet few far cut set "
        "run got let put end top red big low key",
    ),
    4: (
        0.20,
        "that with from this have they were been will more when some time than only also most "
        "over such many then them what made like well just year data each both",
    ),
    5: (
        0.05,
        "which their there would could other first after these about block route token queue "
        "batch serve every still never under since while where small early later",
    ),
}


def _vocabulary() -> tuple[tuple[str, ...], tuple[float, ...]]:
    words: list[str] = []
    weights: list[float] = []
    for probability, text in _WORDS_BY_LENGTH.values():
        group = text.split()
        words += group
        weights += [probability / len(group)] * len(group)
    return tuple(words), tuple(weights)


_WORDS, _WEIGHTS = _vocabulary()


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
    # A word and its space average 4 characters and are at least 3: n_chars / 3 suffice.
    words = rng.choices(_WORDS, weights=_WEIGHTS, k=n_chars // 3 + 2)
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
