"""Splicing a moved request's continuation into the client's one stream. Pure, no I/O.

A streamed generation request running on server A is cut at an event boundary after the client
received k generated tokens, and continued on server B through `/v1/completions` with `prompt`
= the prompt token ids + those k ids, `"stream": true`, `"return_token_ids": true` and
`"stream_options": {"include_usage": true}` (a chat request continues as a completions request:
its chat template was applied already). `Splicer` rewrites B's events so that the client sees
one uninterrupted stream of the kind it asked for, byte for byte what vLLM 0.32 writes (compact
JSON, vLLM's key order):

- every event carries the client's `id`, `created` and `model`; `object` is "text_completion"
  (completions) or "chat.completion.chunk" (chat);
- completions: the choice keeps vLLM's fields in vLLM's order (`index`, `text`, `logprobs`,
  `finish_reason`, `stop_reason`), then `"prompt_token_ids": null` and `token_ids` only when
  the client asked for token ids (the prompt ids went out in the client's first event);
- chat: a token event becomes `{"index", "delta": {"content": text}, "logprobs": null,
  "finish_reason"}`, with no role delta (the client got it from the first stream); the final
  event (finish_reason set) carries `stop_reason` after `finish_reason`, and its delta is `{}`
  when its text is empty; `token_ids` comes last, only when the client asked for token ids;
  `prompt_token_ids` never appears again;
- usage counts the client's request, not B's: prompt_tokens = the original prompt length,
  completion_tokens = k + B's completion tokens, total_tokens their sum. The final usage event
  (with B's `system_fingerprint`) passes only when the client asked `include_usage`; with
  `continuous_usage_stats` as well every token event carries the same corrected usage, counted
  from the events' `token_ids`;
- an error event (`data: {"error": ...}`) and anything that is not a JSON generation event
  pass unchanged; exactly one `data: [DONE]` passes (the first stream's never reached the
  client, it was cut), and nothing after it.

Not covered: logprobs (a request that asked for them is not to be moved: completions keeps the
value B wrote, chat writes null) and tool-call or reasoning parsing, which a completions
continuation cannot do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from proxy.stream.sse import DONE_EVENT
from proxy.stream.token_ledger import EventAligner

COMPLETIONS = "completions"
CHAT = "chat/completions"
ENDPOINTS = (COMPLETIONS, CHAT)

_EVENT_END = b"\n\n"


def event_data(event: bytes) -> bytes | None:
    """The data of one SSE event (its `data:` lines joined by newlines, the one space after the
    colon dropped), or None when the event has no data line (a comment, a keep-alive)."""
    parts: list[bytes] = []
    for line in event.strip(b"\r\n").split(b"\n"):
        line = line.removesuffix(b"\r")
        if line.startswith(b"data:"):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


def event_json(event: bytes) -> Any:
    """The event's data parsed as JSON; None for no data, `[DONE]` or data that is not JSON."""
    data = event_data(event)
    if data is None or data == b"[DONE]":
        return None
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return None


class EventBuffer:
    """Cuts a byte stream into whole SSE events (each without its closing blank line); an
    unfinished event is kept for the next `feed` (by the relay's own EventAligner)."""

    __slots__ = ("_aligner",)

    def __init__(self) -> None:
        self._aligner = EventAligner()

    def feed(self, data: bytes) -> list[bytes]:
        whole = self._aligner.feed(data)
        return [e for e in whole.split(_EVENT_END) if e.strip(b"\r\n")]

    @property
    def pending(self) -> bytes:
        """Bytes of an event not finished yet."""
        return self._aligner.tail


def sse(obj: dict[str, Any]) -> bytes:
    """One `data: <compact json>` event."""
    return b"data: " + orjson.dumps(obj) + _EVENT_END


def stream_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """A streamed usage object, in vLLM's key order (streams leave out the detail fields)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _object(endpoint: str) -> str:
    return "chat.completion.chunk" if endpoint == CHAT else "text_completion"


def _chunk(obj: str, identity: StreamIdentity, choices: list[Any]) -> dict[str, Any]:
    return {
        "id": identity.id,
        "object": obj,
        "created": identity.created,
        "model": identity.model,
        "choices": choices,
    }


def usage_event(
    endpoint: str, identity: StreamIdentity, prompt_tokens: int, completion_tokens: int
) -> bytes:
    """The final usage event of the client's stream, as vLLM writes it."""
    chunk = _chunk(_object(endpoint), identity, [])
    chunk["usage"] = stream_usage(prompt_tokens, completion_tokens)
    return sse(chunk)


def finish_event(
    endpoint: str, identity: StreamIdentity, finish_reason: str, *, token_ids: bool
) -> bytes:
    """The last token event of a choice that finished without new text, as vLLM writes it
    (chat: an empty delta; `token_ids` only when the client asked for token ids)."""
    chat = endpoint == CHAT
    choice: dict[str, Any] = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
    choice.update(logprobs=None, finish_reason=finish_reason, stop_reason=None)
    if token_ids:
        if not chat:
            choice["prompt_token_ids"] = None
        choice["token_ids"] = []
    return sse(_chunk(_object(endpoint), identity, [choice]))


@dataclass(frozen=True, slots=True)
class StreamIdentity:
    """What every event of the client's stream carries: the stream's id, created and model."""

    id: str  # "cmpl-..." / "chatcmpl-..."
    created: int
    model: str

    @classmethod
    def from_event(cls, event: bytes) -> StreamIdentity:
        """From one raw `data: {...}` event of the first stream, with or without its closing
        blank line. ValueError when the event carries no id, created and model."""
        obj = event_json(event)
        if not isinstance(obj, dict):
            raise ValueError("not a JSON data event")
        rid, created, model = obj.get("id"), obj.get("created"), obj.get("model")
        if (
            not isinstance(rid, str)
            or not isinstance(created, int)
            or isinstance(created, bool)
            or not isinstance(model, str)
        ):
            raise ValueError("the event has no id, created and model")
        return cls(rid, created, model)


class Splicer:
    """Rewrites the continuation stream of a moved request into the client's stream (the rules
    are in this module's docstring). One per continuation leg; after a second move, make a new
    one with `tokens_before` = the previous one's `completion_tokens`."""

    __slots__ = (
        "_buffer",
        "_chat",
        "_continuous",
        "_done",
        "_identity",
        "_include_usage",
        "_object",
        "_prompt_tokens",
        "_resent",
        "_seen",
        "_token_ids",
        "_tokens_before",
    )

    def __init__(
        self,
        *,
        endpoint: str,
        identity: StreamIdentity,
        prompt_tokens: int,
        tokens_before: int,
        include_usage: bool,
        continuous_usage: bool,
        token_ids: bool,
        resent_ids: int = 0,
    ) -> None:
        """`endpoint`: what the client asked, "completions" or "chat/completions";
        `prompt_tokens`: the client's original prompt length; `tokens_before`: the generated
        tokens the client already has; `include_usage` / `continuous_usage`: the client's
        `stream_options` (continuous usage only counts with include_usage, as in vLLM);
        `token_ids`: the client itself asked `return_token_ids`; `resent_ids`: token ids the
        client already received whose tokens the continuation generates again (their text
        was still incomplete at the cut): left out of the client's token_ids once."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, not {endpoint!r}")
        self._chat = endpoint == CHAT
        self._object = _object(endpoint)
        self._identity = identity
        self._prompt_tokens = prompt_tokens
        self._tokens_before = tokens_before
        self._include_usage = include_usage
        self._continuous = include_usage and continuous_usage
        self._token_ids = token_ids
        self._resent = resent_ids
        self._seen = 0
        self._done = False
        self._buffer = EventBuffer()

    @property
    def completion_tokens(self) -> int:
        """tokens_before + the tokens seen in the continuation so far (B's own count once its
        usage event has passed)."""
        return self._tokens_before + self._seen

    @property
    def done(self) -> bool:
        """Whether `data: [DONE]` has passed."""
        return self._done

    def rewrite(self, events: bytes) -> bytes:
        """Whole SSE events of the continuation stream in (`data: ...\\n\\n` repeated, or b""),
        the events the client must see out. An unfinished trailing event is held until the
        rest of it comes."""
        out = [self._event(e) for e in self._buffer.feed(events)]
        return b"".join(out)

    def _event(self, event: bytes) -> bytes:
        if self._done:
            return b""
        data = event_data(event)
        if data == b"[DONE]":
            self._done = True
            return DONE_EVENT
        obj = event_json(event)
        if not isinstance(obj, dict) or not isinstance(obj.get("choices"), list):
            return event + _EVENT_END  # an error event, or nothing the splicer knows
        choices: list[Any] = obj["choices"]
        if not choices:
            return self._usage_event(obj)
        out = [self._choice(c) for c in choices if isinstance(c, dict)]
        chunk = self._envelope(out)
        if self._continuous:
            chunk["usage"] = stream_usage(self._prompt_tokens, self.completion_tokens)
        return sse(chunk)

    def _envelope(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return _chunk(self._object, self._identity, choices)

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            self._seen += len(ids)
        text = choice.get("text")
        text = text if isinstance(text, str) else ""
        finish = choice.get("finish_reason")
        out: dict[str, Any]
        if self._chat:
            out = {
                "index": choice.get("index", 0),
                "delta": {"content": text} if (text or finish is None) else {},
                "logprobs": None,
                "finish_reason": finish,
            }
            if finish is not None:
                out["stop_reason"] = choice.get("stop_reason")
        else:
            out = {
                "index": choice.get("index", 0),
                "text": text,
                "logprobs": choice.get("logprobs"),
                "finish_reason": finish,
                "stop_reason": choice.get("stop_reason"),
            }
            if self._token_ids:
                out["prompt_token_ids"] = None
        if self._token_ids:
            ids_out = ids if isinstance(ids, list) else []
            if self._resent and ids_out:
                skip = min(self._resent, len(ids_out))
                ids_out = ids_out[skip:]
                self._resent -= skip
            out["token_ids"] = ids_out
        return out

    def _usage_event(self, obj: dict[str, Any]) -> bytes:
        """B's final usage event, counted for the client's request; b"" unless the client
        asked include_usage (or when the event has no usage)."""
        use = obj.get("usage")
        if not isinstance(use, dict):
            return b""
        done = use.get("completion_tokens")
        if isinstance(done, int) and not isinstance(done, bool):
            self._seen = done  # B's count is the authority on what it generated
        if not self._include_usage:
            return b""
        chunk = self._envelope([])
        chunk["usage"] = stream_usage(self._prompt_tokens, self.completion_tokens)
        if "system_fingerprint" in obj:
            chunk["system_fingerprint"] = obj["system_fingerprint"]
        return sse(chunk)
