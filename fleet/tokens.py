"""Prompt token counts for routing.

Three sources, chosen per deployment:
- `estimate` (default): characters / `chars_per_token`; free, good enough for load balancing;
- `hf`: a Hugging Face `tokenizer.json` on local disk, via the `tokenizers` package;
- `remote`: the backends' own `POST /tokenize`, asked as fleet/prompt_tokens.py asks them (a
  `PromptTokenizer`: turns over the backends serving the model, a chat request sent as its
  `messages`), so the count is exact for the engine's tokenizer and chat template; costs a
  round trip.

The proxy calls `await counter.count(text, model, endpoint, body)` once per request. In
`estimate` mode that returns without leaving the event loop; the tokenizer runs in a worker
thread (`asyncio.to_thread`) and the remote call is an async httpx request, so neither blocks
the loop. Results are cached in an LRU keyed by (model, a 128-bit hash of the text, or of what
/tokenize is sent), so repeated prompts (retries, multi-turn prefixes sent again) are counted
once and no prompt text is kept.
Any failure of the exact sources falls back to the estimate: routing must not fail on counting.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Mapping
from typing import Any, Literal, Protocol

import xxhash
from cachetools import LRUCache

from fleet.prompt_tokens import Prompt, PromptTokenizer, TokenizeError, prompt_key, prompt_of

Mode = Literal["estimate", "hf", "remote"]


def estimate_tokens(text: str, chars_per_token: float = 4.0) -> int:
    """The one character estimate of a prompt's tokens: characters / `chars_per_token`,
    rounded up (a non-empty prompt is at least one token). Routing, the counter's fallback
    and the tests all use this."""
    return math.ceil(len(text) / chars_per_token)


class Encoder(Protocol):
    def encode(self, text: str) -> Any: ...


def load_hf_tokenizer(path: str) -> Encoder:
    """Load a local `tokenizer.json` (a file, or a directory that holds one); never downloads."""
    from pathlib import Path

    from tokenizers import Tokenizer

    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    tok: Encoder = Tokenizer.from_file(str(p))
    return tok


class TokenCounter:
    def __init__(
        self,
        mode: Mode = "estimate",
        *,
        chars_per_token: float = 4.0,
        tokenizer: Encoder | None = None,
        tokenizer_path: str | None = None,
        remote: PromptTokenizer | None = None,
        cache_size: int = 4096,
    ) -> None:
        """`remote` asks the backends for token ids (remote mode: a
        fleet.prompt_tokens.RemoteTokenizer); `tokenizer` or `tokenizer_path` is needed in hf
        mode."""
        if chars_per_token <= 0:
            raise ValueError("chars_per_token must be > 0")
        if mode == "hf" and tokenizer is None:
            if tokenizer_path is None:
                raise ValueError("hf token counting needs tokenizer_path (a local tokenizer.json)")
            tokenizer = load_hf_tokenizer(tokenizer_path)
        if mode == "remote" and remote is None:
            raise ValueError("remote token counting needs a remote prompt tokenizer")
        self.mode: Mode = mode
        self.chars_per_token = chars_per_token
        self._tokenizer = tokenizer
        self._remote = remote
        self._cache: LRUCache[tuple[str, bytes], int] = LRUCache(maxsize=cache_size)
        self.fallbacks = 0  # exact counts that failed and fell back to the estimate

    def estimate(self, text: str) -> int:
        """The character estimate; synchronous and cheap."""
        return estimate_tokens(text, self.chars_per_token)

    async def count(self, text: str, model: str, endpoint: str, body: Mapping[str, Any]) -> int:
        """The prompt's tokens: `text` is the prompt as routing sees it, `body` the request of
        `endpoint` ("completions", "chat/completions") it came from, for /tokenize."""
        if self.mode == "estimate" or not text:
            return self.estimate(text)
        prompt: Prompt | None = None
        if self.mode == "hf":
            key = (model, xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass")))
        else:
            asked = prompt_of(endpoint, body)
            if not isinstance(asked, Prompt):
                return self.estimate(text)  # several prompts: not one /tokenize call
            prompt = asked
            remote_key = prompt_key(model, prompt)
            if remote_key is None:
                return self.estimate(text)
            key = remote_key
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        try:
            if prompt is None:
                n = await asyncio.to_thread(self._encode_len, text)
            else:
                assert self._remote is not None
                n = len(await self._remote.tokenize(model, prompt))
        except (TokenizeError, ValueError, KeyError, TypeError):
            self.fallbacks += 1
            return self.estimate(text)
        self._cache[key] = n
        return n

    def cached_entries(self) -> int:
        return len(self._cache)

    def _encode_len(self, text: str) -> int:
        assert self._tokenizer is not None
        return len(self._tokenizer.encode(text).ids)
