"""Prompt token ids for the precise index: what a request asks to tokenize, the bounded
cache in front of a tokenizer, a local HF tokenizer with its chat template (sandboxed, off
the event loop), and the backends' own /tokenize on simulated engines."""

from __future__ import annotations

import json
import threading
from array import array
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from fleet.prompt_tokens import (
    HfTokenizer,
    Prompt,
    PromptTokens,
    RemoteTokenizer,
    TokenIds,
    TokenizeError,
    prompt_of,
)
from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer as SimTokenizer
from tests.support.word_tokenizer import save_word_tokenizer

MESSAGES = [{"role": "user", "content": "the quick fox"}]


def test_what_a_request_asks_to_tokenize() -> None:
    chat = prompt_of("chat/completions", {"model": "m", "messages": MESSAGES, "max_tokens": 3})
    assert chat == Prompt(True, {"messages": MESSAGES})
    assert prompt_of("completions", {"prompt": ["one"], "add_special_tokens": False}) == Prompt(
        False, {"prompt": "one", "add_special_tokens": False}
    )
    assert prompt_of("completions", {"prompt": [5, 6, 7]}) == array("I", [5, 6, 7])
    assert prompt_of("completions", {"prompt": [[5, 6]]}) == array("I", [5, 6])
    for not_one in ({"prompt": ["a", "b"]}, {"prompt": [-1]}, {"prompt": 3}, {"prompt": []}):
        assert prompt_of("completions", not_one) is None
    assert prompt_of("embeddings", {"input": "x"}) is None


class Counting:
    """A tokenizer that gives one id per word and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    async def tokenize(self, model: str, prompt: Prompt) -> TokenIds:
        self.calls += 1
        text = str(prompt.request.get("prompt", ""))
        if text == "fail":
            raise TokenizeError("no")
        return array("I", [len(w) for w in text.split()])


async def test_the_cache_keeps_answers_by_model_and_prompt_bounded_by_tokens() -> None:
    inner = Counting()
    tokens = PromptTokens(inner, cache_tokens=5)
    body = {"prompt": "aa bbb c"}
    assert list(await tokens.token_ids("completions", "m", body) or []) == [2, 3, 1]
    assert list(await tokens.token_ids("completions", "m", body) or []) == [2, 3, 1]
    assert (inner.calls, tokens.cache_hits, tokens.cached_tokens()) == (1, 1, 3)
    await tokens.token_ids("completions", "other", body)  # another model: its own entry
    assert inner.calls == 2 and tokens.cached_tokens() == 3  # 6 tokens > 5: the LRU went
    assert await tokens.token_ids("completions", "m", {"prompt": "fail"}) is None
    assert tokens.failures == 1
    # Token ids given: no tokenizer at all.
    assert list(await tokens.token_ids("completions", "m", {"prompt": [9, 8]}) or []) == [9, 8]
    assert inner.calls == 3


@pytest.fixture
def hf_dir(tmp_path: Path) -> Path:
    words = "<s> the quick brown fox user assistant : |"
    save_word_tokenizer(tmp_path / "tokenizer.json", words, specials=("<s>",))
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} | "
        "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}"
    )
    config = {"bos_token": {"content": "<s>"}, "chat_template": template}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


async def test_hf_renders_the_chat_template_and_encodes_off_the_loop(hf_dir: Path) -> None:
    hf = HfTokenizer(str(hf_dir))
    plain = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    threads: list[str] = []
    encode = hf._encode

    def recording(prompt: Prompt) -> TokenIds:
        threads.append(threading.current_thread().name)
        return encode(prompt)

    hf._encode = recording  # type: ignore[method-assign]
    ids = await hf.tokenize("m", Prompt(True, {"messages": MESSAGES}))
    expected = plain.encode("<s> user : the quick fox | assistant :").ids
    assert list(ids) == expected and len(expected) == 9
    assert threads and threads[0] != threading.main_thread().name
    parts = [{"role": "user", "content": [{"type": "text", "text": "the quick fox"}]}]
    assert list(await hf.tokenize("m", Prompt(True, {"messages": parts}))) == expected
    no_gen = await hf.tokenize("m", Prompt(True, {"messages": MESSAGES,
                                                  "add_generation_prompt": False}))  # fmt: skip
    assert list(no_gen) == expected[:-2]
    assert list(await hf.tokenize("m", Prompt(False, {"prompt": "brown fox"}))) == (
        plain.encode("brown fox").ids
    )


async def test_hf_templates_run_sandboxed(hf_dir: Path) -> None:
    config = {"chat_template": "{{ messages.__class__.__mro__ }}"}
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(TokenizeError):
        await HfTokenizer(str(hf_dir)).tokenize("m", Prompt(True, {"messages": MESSAGES}))
    (hf_dir / "tokenizer_config.json").unlink()
    with pytest.raises(TokenizeError, match="no chat template"):
        await HfTokenizer(str(hf_dir)).tokenize("m", Prompt(True, {"messages": MESSAGES}))


async def test_remote_asks_the_backends_in_turn_and_gets_their_exact_ids() -> None:
    sim_tokenizer = SimTokenizer()
    asked: list[str] = []

    async def record(request: httpx.Request) -> None:
        asked.append(f"{request.url.scheme}://{request.url.netloc.decode()}")

    async with (
        await start_fleet(2, tokenizer=sim_tokenizer) as fleet,
        httpx.AsyncClient(timeout=10, event_hooks={"request": [record]}) as client,
    ):
        remote = RemoteTokenizer(client, lambda model: fleet.urls)
        chat = Prompt(True, {"messages": MESSAGES, "add_generation_prompt": True})
        first = await remote.tokenize("sim-llama-8b", chat)
        second = await remote.tokenize("sim-llama-8b", chat)
        # The engine's own chat template: what it will prefill.
        expected = sim_tokenizer.apply_chat_template([("user", "the quick fox")], True, False)
        assert list(first) == list(second) == expected
        assert asked == fleet.urls  # one each, not both to the first
        # A backend that does not answer: the next one does.
        await fleet.engines[0].crash()
        asked.clear()
        for _ in range(2):
            assert list(await remote.tokenize("sim-llama-8b", chat)) == expected
        assert asked.count(fleet.urls[1]) == 2
        with pytest.raises(TokenizeError):
            await RemoteTokenizer(client, lambda model: []).tokenize("m", chat)
