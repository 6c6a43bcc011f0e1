"""A deterministic tokenizer with a fixed vocabulary, built from rules instead of a trained file.

Why hand-written: a real tokenizer needs a vocabulary file (a download or a training run at
start-up); the simulator only needs text <-> ids that are deterministic, round-trip, and
about as dense as a real BPE tokenizer so that a router's `chars / 4` estimate stays sane.

The vocabulary (`VOCAB_SIZE` = 128,256 ids, the size of Llama 3's):
- a few special tokens (BOS, EOS, chat header markers) that decode to "";
- 256 byte tokens, the fallback for anything else (punctuation, non-ASCII as UTF-8 bytes);
- word pieces: about 300 common English words and suffixes; 1-3 letters, lower-case or
  capitalised, with or without a leading space; digit groups of 1-3 digits; 4-letter
  pieces of the 15 most frequent English letters after a space; and 4-letter word interiors
  of the 12 most frequent letters until the vocabulary is full.
Encoding is greedy longest match over these pieces. General English prose averages about
3.3-3.5 characters per token and the benchmark's filler text (bench/textgen.py) about 4.0
(tests/unit/simulator/test_tokenizer.py bounds it), near the ~4 of real BPE tokenizers.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterable, Sequence

VOCAB_SIZE = 128_256
PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
HEADER_START_ID = 3
HEADER_END_ID = 4
SPECIAL_TOKENS = (
    "<pad>",
    "<|begin_of_text|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
)
BYTE_BASE = len(SPECIAL_TOKENS)
PIECE_BASE = BYTE_BASE + 256

_LOWER = string.ascii_lowercase
_FREQUENT = "etaoinshrdlcumw"  # the 15 most frequent letters in English text
# Frequent English words and word parts, whole pieces as in a trained vocabulary.
_COMMON_WORDS = """
the of and to in is was for that with as on by at from his her are be this which or have
had not but they one all were we an their there been has more its who can if will would
about when so what up out other into than them these some could time only new may first
also after any most made over such where through should because each many those between
both under while being used during before people year years work world state system
number however general public company group national service development different
important another against without within example process program question called three
small place point long great little right still found every again never often always
something following second hand high part house it he she you then like well just two
make know take see come think look want give use find tell ask seem feel try leave call
good last own old big few public bad same able day way man thing woman life child back
water room mother area money story fact month lot study book eye job word business side
kind head far black long both home light stone river city paper table green early later
since power memory route token queue batch block reply serve set put end why let help
show hear play run move live believe hold bring happen write provide sit stand lose pay
meet include continue learn change lead understand watch follow stop create speak read
allow add spend grow open walk win offer remember love consider appear buy wait die send
expect build stay fall cut reach kill remain suggest raise pass sell require report decide
pull ing tion ment ness able ible ally ence ance ting ring ered ings ions ated ates ed er
ly est ful less ous ive ize ise age ship ward
""".split()  # noqa: SIM905 (a word list reads better as text)
_CHUNK = re.compile(r" ?[A-Za-z]+| ?[0-9]+|.", re.DOTALL)


def _pieces() -> list[str]:
    pieces: list[str] = []
    seen: set[str] = set()

    def add(items: Iterable[str]) -> None:
        for p in items:
            if p not in seen and len(pieces) < VOCAB_SIZE - PIECE_BASE:
                seen.add(p)
                pieces.append(p)

    add(" " + w for w in _COMMON_WORDS)
    add(_COMMON_WORDS)
    add(" " + w.capitalize() for w in _COMMON_WORDS)
    add(w.capitalize() for w in _COMMON_WORDS)
    for n in (1, 2, 3):
        lower = ["".join(t) for t in itertools.product(_LOWER, repeat=n)]
        add(" " + w for w in lower)
        add(lower)
        add(" " + w.capitalize() for w in lower)
        if n < 3:  # capitalised without a space only begins a text: short pieces suffice
            add(w.capitalize() for w in lower)
    for n in (1, 2, 3):
        digits = ["".join(t) for t in itertools.product(string.digits, repeat=n)]
        add(" " + d for d in digits)
        add(digits)
    add(" " + "".join(t) for t in itertools.product(_FREQUENT, repeat=4))
    # Word interiors: 4-letter pieces of the 12 most frequent letters, until the vocabulary
    # is full.
    add("".join(t) for t in itertools.product(_FREQUENT[:12], repeat=4))
    return pieces


class Tokenizer:
    """Text <-> token ids. Build one per process and share it: the tables take ~0.5 s."""

    def __init__(self) -> None:
        self._id_to_str: list[str] = list(SPECIAL_TOKENS) + [f"<0x{b:02X}>" for b in range(256)]
        pieces = _pieces()
        self._id_to_str.extend(pieces)
        self._piece_to_id = {p: PIECE_BASE + i for i, p in enumerate(pieces)}
        self._max_piece = max(len(p) for p in pieces)
        # Ids the language model may generate: word pieces that start with a space or a letter,
        # so that generated text reads as words.
        self.generatable: tuple[int, ...] = tuple(
            PIECE_BASE + i for i, p in enumerate(pieces) if p[0] == " " and p[1:].isalpha()
        )
        assert len(self._id_to_str) == VOCAB_SIZE

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids: list[int] = [BOS_ID] if add_bos else []
        table = self._piece_to_id
        for chunk in _CHUNK.findall(text):
            i, n = 0, len(chunk)
            while i < n:
                for length in range(min(self._max_piece, n - i), 0, -1):
                    tid = table.get(chunk[i : i + length])
                    if tid is not None:
                        ids.append(tid)
                        i += length
                        break
                else:  # no piece: fall back to the UTF-8 bytes of one character
                    ids.extend(BYTE_BASE + b for b in chunk[i].encode("utf-8"))
                    i += 1
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        out: list[str] = []
        pending = bytearray()
        for tid in ids:
            if BYTE_BASE <= tid < PIECE_BASE:
                pending.append(tid - BYTE_BASE)
                continue
            if pending:
                out.append(pending.decode("utf-8", errors="replace"))
                pending.clear()
            if tid < BYTE_BASE:
                if not skip_special:
                    out.append(SPECIAL_TOKENS[tid])
            elif tid < VOCAB_SIZE:
                out.append(self._id_to_str[tid])
        if pending:
            out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def token_str(self, tid: int) -> str:
        """The text one token adds (specials add nothing), as streaming emits it."""
        if PIECE_BASE <= tid < VOCAB_SIZE:
            return self._id_to_str[tid]
        if BYTE_BASE <= tid < PIECE_BASE:
            return bytes([tid - BYTE_BASE]).decode("utf-8", errors="replace")
        return ""

    def piece(self, tid: int) -> str:
        """The vocabulary entry of an id, specials included (for /tokenize's token_strs)."""
        return self._id_to_str[tid]

    def apply_chat_template(
        self,
        messages: Sequence[tuple[str, str]],
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """A Llama-3-shaped template over (role, content) pairs."""
        ids = [BOS_ID]
        last = len(messages) - 1
        for i, (role, content) in enumerate(messages):
            ids.append(HEADER_START_ID)
            ids.extend(self.encode(role))
            ids.append(HEADER_END_ID)
            ids.extend(self.encode("\n\n" + content))
            if not (continue_final_message and i == last):
                ids.append(EOS_ID)
        if add_generation_prompt and not continue_final_message:
            ids.append(HEADER_START_ID)
            ids.extend(self.encode("assistant"))
            ids.append(HEADER_END_ID)
            ids.extend(self.encode("\n\n"))
        return ids
