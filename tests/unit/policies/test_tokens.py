from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx
import pytest
from tokenizers import Tokenizer

from fleet.prompt_tokens import RemoteTokenizer
from fleet.tokens import TokenCounter
from tests.support.word_tokenizer import save_word_tokenizer


@pytest.mark.parametrize(
    ("text", "expected"), [("", 0), ("abcd", 1), ("abcde", 2), ("x" * 400, 100)]
)
def test_estimate_is_characters_over_four(text: str, expected: int) -> None:
    assert TokenCounter().estimate(text) == expected


async def test_estimate_mode_count_is_the_estimate() -> None:
    assert await TokenCounter().count("x" * 40, "m", "completions", {"prompt": "x" * 40}) == 10


@pytest.fixture
def tokenizer_json(tmp_path: Path) -> Path:
    return save_word_tokenizer(
        tmp_path / "tokenizer.json", "the quick brown fox jumps over the lazy dog"
    )


async def test_hf_tokenizer_counts_words_off_the_event_loop(tokenizer_json: Path) -> None:
    threads: list[str] = []

    class Recording:
        def __init__(self) -> None:
            self.inner = Tokenizer.from_file(str(tokenizer_json))

        def encode(self, text: str) -> object:
            threads.append(threading.current_thread().name)
            return self.inner.encode(text)

    counter = TokenCounter("hf", tokenizer=Recording())
    assert await counter.count("the lazy dog jumps", "m", *_completion("the lazy dog jumps")) == 4
    assert threads and threads[0] != threading.main_thread().name
    # Cached: a second count does not tokenize again.
    assert await counter.count("the lazy dog jumps", "m", *_completion("the lazy dog jumps")) == 4
    assert len(threads) == 1
    assert counter.cached_entries() == 1


async def test_hf_tokenizer_loads_from_a_directory(tokenizer_json: Path) -> None:
    counter = TokenCounter("hf", tokenizer_path=str(tokenizer_json.parent))
    assert await counter.count("quick brown fox", "m", *_completion("quick brown fox")) == 3


def _completion(prompt: str) -> tuple[str, dict[str, object]]:
    return "completions", {"model": "m", "prompt": prompt}


async def test_remote_tokenize_is_used_cached_and_falls_back() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if body["prompt"] == "boom":
            return httpx.Response(500)
        return httpx.Response(200, json={"count": 7, "tokens": [1] * 7, "max_model_len": 4096})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        remote = RemoteTokenizer(client, lambda model: ["http://backend:8000"])
        counter = TokenCounter("remote", remote=remote)
        assert await counter.count("hello there", "m", *_completion("hello there")) == 7
        assert await counter.count("hello there", "m", *_completion("hello there")) == 7
        assert len(seen) == 1 and seen[0] == {"model": "m", "prompt": "hello there"}
        # A failing backend costs accuracy, never the request.
        assert await counter.count("boom", "m", *_completion("boom")) == 1
        assert counter.fallbacks == 1


async def test_remote_counts_turn_over_the_backends_and_send_chat_messages() -> None:
    hosts: list[str] = []
    bodies: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={"count": 3, "tokens": [1, 2, 3]})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        remote = RemoteTokenizer(client, lambda model: ["http://a:8000", "http://b:8000"])
        counter = TokenCounter("remote", remote=remote)
        for i in range(4):
            text = f"prompt {i}"
            assert await counter.count(text, "m", *_completion(text)) == 3
        assert sorted(hosts) == ["a", "a", "b", "b"]
        messages = [{"role": "user", "content": "hi"}]
        chat = {"model": "m", "messages": messages, "max_tokens": 4}
        assert await counter.count("user:hi\n", "m", "chat/completions", chat) == 3
        assert bodies[-1] == {"model": "m", "messages": messages}


def test_misconfiguration_is_refused() -> None:
    with pytest.raises(ValueError, match="tokenizer_path"):
        TokenCounter("hf")
    with pytest.raises(ValueError, match="remote"):
        TokenCounter("remote")
