"""Build a tiny random-weight float32 Llama with a locally trained tokenizer, offline.

Runs inside the vLLM venv (it needs torch, transformers and tokenizers). The result is
a directory vLLM serves with `--model DIR`. `initializer_range=0.5` matters: with the
default 0.02 a random model greedily repeats one token, which would make every
"same output" comparison in the tier trivially true.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

# Bump when anything below changes, so a cached model is rebuilt.
RECIPE_VERSION = "1"
VOCAB_SIZE = 2048
SPECIAL_TOKENS = [
    "<unk>",
    "<s>",
    "</s>",
    "<pad>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|end|>",
]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
WORDS = [
    "the",
    "a",
    "an",
    "of",
    "to",
    "in",
    "and",
    "or",
    "for",
    "with",
    "on",
    "at",
    "by",
    "from",
    "as",
    "is",
    "was",
    "are",
    "be",
    "been",
    "it",
    "this",
    "that",
    "these",
    "those",
    "router",
    "proxy",
    "engine",
    "request",
    "token",
    "cache",
    "prefix",
    "block",
    "decode",
    "prefill",
    "stream",
    "server",
    "client",
    "model",
    "fleet",
    "policy",
    "load",
    "queue",
    "latency",
    "throughput",
    "batch",
    "memory",
    "user",
    "system",
    "assistant",
    "question",
    "answer",
    "hello",
    "world",
    "please",
    "tell",
    "me",
    "about",
    "how",
    "what",
    "why",
    "when",
    "where",
    "which",
    "small",
    "large",
    "fast",
    "slow",
    "first",
    "last",
    "next",
    "time",
    "data",
    "value",
    "number",
    "list",
    "table",
    "story",
    "river",
    "mountain",
    "city",
    "sun",
    "moon",
    "star",
    "tree",
    "house",
    "road",
    "water",
    "fire",
    "stone",
    "light",
    "night",
    "day",
    "morning",
    "write",
    "read",
    "open",
    "close",
    "send",
    "receive",
    "start",
    "stop",
    "begin",
    "end",
    "run",
    "walk",
    "think",
    "know",
    "see",
    "say",
    "make",
    "good",
    "new",
    "old",
    "long",
    "short",
    "high",
    "low",
    "right",
    "left",
    "early",
    "late",
    "quick",
    "quiet",
    "bright",
    "dark",
    "warm",
    "cold",
]


def corpus(lines: int, seed: int) -> list[str]:
    """Deterministic pseudo-English text with digits and punctuation, so BPE learns merges."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 24)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        sentence = " ".join(words)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ",", ":"]))
    return out


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    # Byte-level: any input text encodes, whatever characters a test sends.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(20000, seed=1234), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path) -> None:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(out)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        initializer_range=0.5,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    out: Path = args.out
    marker = out / "fleet-proxy-recipe.json"
    up_to_date = marker.exists() and json.loads(marker.read_text()).get("recipe") == RECIPE_VERSION
    if up_to_date and not args.force:
        print(f"tiny model already built in {out}", file=sys.stderr)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_model(out)
    marker.write_text(json.dumps({"recipe": RECIPE_VERSION}) + "\n")
    print(f"tiny model built in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
