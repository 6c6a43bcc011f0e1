"""A request's prompt as the engine's token ids (chat template applied), for the precise
prefix index, which names blocks by their token ids.

Two tokenizers, one protocol:
- `remote`: the backends' own `POST /tokenize` (chat requests send `messages` and
  `add_generation_prompt`): exact for each engine's tokenizer and template; the calls turn
  over the backends serving the model rather than all going to one;
- `hf`: a local `tokenizer.json` via the `tokenizers` package, and the chat template of the
  `tokenizer_config.json` (or `chat_template.jinja`) beside it, rendered in jinja2's sandbox.
Either runs off the event loop (an HTTP call, or a worker thread). Results are kept in an LRU
bounded by the tokens it holds, keyed by (model, a 128-bit hash of what would be sent to
/tokenize), so a prompt sent again (retries, shared system prompts) is tokenized once and no
prompt text is kept. A prompt given as token ids needs no tokenizer. Any failure gives None:
routing falls back to the approximate index, it never fails on tokenizing.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeAlias

import httpx
import orjson
import xxhash
from cachetools import LRUCache
from jinja2 import Template, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

log = logging.getLogger("fleet_proxy.prompt_tokens")

# Token ids as an array of "I": 4 bytes a token in the cache, and what chain_keys hashes.
TokenIds: TypeAlias = "array[int]"

# Fields of a chat request that change its rendered prompt: sent to /tokenize as given.
_CHAT_FIELDS = (
    "messages",
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "tools",
    "documents",
    "chat_template",
    "chat_template_kwargs",
)


class TokenizeError(Exception):
    """This prompt could not be tokenized here; routing does without its token ids."""


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt to tokenize: the body of a /tokenize request, less the model."""

    chat: bool
    request: Mapping[str, Any]


class PromptTokenizer(Protocol):
    async def tokenize(self, model: str, prompt: Prompt) -> TokenIds:
        """The prompt's token ids; TokenizeError when this tokenizer cannot tell."""
        ...


def prompt_of(endpoint: str, body: Mapping[str, Any]) -> Prompt | TokenIds | None:
    """What to tokenize for a request; its token ids when it gives them; None when it is not
    one prompt (a batch of several, a malformed field)."""
    if endpoint == "chat/completions":
        return Prompt(True, {k: body[k] for k in _CHAT_FIELDS if k in body})
    if endpoint != "completions":
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        request: dict[str, Any] = {"prompt": prompt}
        if "add_special_tokens" in body:
            request["add_special_tokens"] = body["add_special_tokens"]
        return Prompt(False, request)
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        try:
            return array("I", prompt)
        except OverflowError:
            return None
    return None


class PromptTokens:
    """The cached front of a tokenizer."""

    def __init__(self, tokenizer: PromptTokenizer, cache_tokens: int = 4_000_000) -> None:
        self.tokenizer = tokenizer
        self._cache: LRUCache[tuple[str, bytes], TokenIds] = LRUCache(
            maxsize=cache_tokens, getsizeof=lambda ids: max(1, len(ids))
        )
        self.tokenized = 0
        self.cache_hits = 0
        self.failures = 0

    async def token_ids(
        self, endpoint: str, model: str, body: Mapping[str, Any]
    ) -> Sequence[int] | None:
        prompt = prompt_of(endpoint, body)
        if prompt is None or isinstance(prompt, array):
            return prompt
        key = prompt_key(model, prompt)
        if key is None:
            return None
        ids = self._cache.get(key)
        if ids is not None:
            self.cache_hits += 1
            return ids
        try:
            ids = await self.tokenizer.tokenize(model, prompt)
        except TokenizeError as e:
            self.failures += 1
            log.debug("prompt not tokenized: %s", e)
            return None
        self.tokenized += 1
        if len(ids) <= self._cache.maxsize:
            self._cache[key] = ids
        return ids

    def cached_tokens(self) -> int:
        return int(self._cache.currsize)


_SORTED = orjson.OPT_SORT_KEYS


def prompt_key(model: str, prompt: Prompt) -> tuple[str, bytes] | None:
    """A cache key for a prompt: (model, a 128-bit hash of what /tokenize would be sent), so
    no prompt text is kept; None when it is not JSON (orjson refuses what /tokenize would)."""
    try:
        return (model, xxhash.xxh3_128_digest(orjson.dumps(prompt.request, option=_SORTED)))
    except TypeError:
        return None


class RemoteTokenizer:
    """POST /tokenize on the backends serving the model, taking turns; the next backend is
    tried when one fails, up to `attempts`."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        urls_for: Callable[[str], Sequence[str]],
        attempts: int = 2,
    ) -> None:
        self._client = client
        self._urls_for = urls_for
        self._attempts = attempts
        self._turn = itertools.count()

    async def tokenize(self, model: str, prompt: Prompt) -> TokenIds:
        urls = list(self._urls_for(model))
        if not urls:
            raise TokenizeError(f"no backend serves {model!r} for /tokenize")
        start = next(self._turn) % len(urls)
        order = urls[start:] + urls[:start]
        last: Exception | None = None
        for base in order[: self._attempts]:
            try:
                resp = await self._client.post(
                    f"{base}/tokenize", json={"model": model, **prompt.request}
                )
                resp.raise_for_status()
                tokens = resp.json()["tokens"]
                if not isinstance(tokens, list) or any(type(t) is not int for t in tokens):
                    raise TypeError("tokens is not a list of token ids")
                return array("I", tokens)
            except (httpx.HTTPError, ValueError, KeyError, TypeError, OverflowError) as e:
                last = e
        raise TokenizeError(f"/tokenize failed: {last!r}")


class HfTokenizer:
    """A local Hugging Face tokenizer directory (or tokenizer.json): never downloads."""

    def __init__(self, path: str) -> None:
        from tokenizers import Tokenizer

        p = Path(path)
        folder = p if p.is_dir() else p.parent
        self._tokenizer = Tokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p))
        config = _read_json(folder / "tokenizer_config.json")
        self._specials = {
            name: _token_text(config.get(name)) for name in ("bos_token", "eos_token")
        }
        self._template = _chat_template(folder, config)

    async def tokenize(self, model: str, prompt: Prompt) -> TokenIds:
        return await asyncio.to_thread(self._encode, prompt)

    def _encode(self, prompt: Prompt) -> TokenIds:
        request = prompt.request
        if prompt.chat:
            text = self._render(request)
            add_special = request.get("add_special_tokens", False)
        else:
            text = request["prompt"]
            add_special = request.get("add_special_tokens", True)
        try:
            ids = self._tokenizer.encode(text, add_special_tokens=bool(add_special)).ids
            return array("I", ids)
        except (TypeError, ValueError, OverflowError) as e:
            raise TokenizeError(str(e)) from None

    def _render(self, request: Mapping[str, Any]) -> str:
        if self._template is None:
            raise TokenizeError("the tokenizer has no chat template")
        if request.get("continue_final_message") or "chat_template" in request:
            raise TokenizeError("continue_final_message and chat_template need /tokenize")
        messages = request.get("messages")
        if not isinstance(messages, list):
            raise TokenizeError("messages is not a list")
        kwargs = request.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, dict):
            raise TokenizeError("chat_template_kwargs is not an object")
        try:
            return self._template.render(
                **{
                    **kwargs,
                    **self._specials,
                    "messages": [_text_message(m) for m in messages],
                    "add_generation_prompt": request.get("add_generation_prompt", True),
                    "tools": request.get("tools"),
                    "documents": request.get("documents"),
                }
            )
        except (TemplateError, TypeError, ValueError) as e:
            raise TokenizeError(f"chat template: {e}") from None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str:
    """A special token as a config names it: a string, or an object with its `content`."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _raise(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # As chat templates expect: no HTML escaping, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _chat_template(folder: Path, config: Mapping[str, Any]) -> Template | None:
    source: Any = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text(encoding="utf-8")
    if not isinstance(source, str):
        return None
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


def _text_message(message: Any) -> Any:
    """A message whose content is a list of text parts, as one string (what a template that
    expects strings gets from vLLM for text-only content)."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" for p in content
    ):
        return {**message, "content": "\n".join(str(p.get("text", "")) for p in content)}
    return message
