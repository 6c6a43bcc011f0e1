"""A Hugging Face tokenizer.json made on the spot: one id per whitespace-separated word of a
small vocabulary, so tests know every id without downloading a model."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, trainers


def save_word_tokenizer(path: Path, text: str, specials: tuple[str, ...] = ()) -> Path:
    """A word-level tokenizer of `text`'s words (plus `[UNK]` and `specials`), saved at
    `path`."""
    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([text], trainers.WordLevelTrainer(special_tokens=["[UNK]", *specials]))
    tok.save(str(path))
    return path
