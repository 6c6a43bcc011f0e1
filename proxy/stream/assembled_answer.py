"""The non-streamed answer, built from stream events. Pure, no I/O.

The proxy may serve a non-streamed client request by streaming it from the backend with
`"stream": true`, `"stream_options": {"include_usage": true}` and `"return_token_ids": true`
(so that the request can be moved mid-way), and answering the one JSON body vLLM 0.32 would
have written for `"stream": false`. `Assembler` takes the client-shaped events of that stream:
the first leg's raw vLLM events, then, after a move, `Splicer` output (made with
`token_ids=True`, so that every event carries its ids). From them:

- `id`, `created`, `model` of the first event; `object` "text_completion" / "chat.completion";
- per choice: the text (or message content) concatenated, `finish_reason` and `stop_reason`
  of the event that finished it, the generated `token_ids` concatenated;
- `prompt_token_ids`: from the first event (in the choice for completions, top-level for chat);
- `token_ids` and `prompt_token_ids` are null unless the client asked `return_token_ids`, as
  vLLM writes them for a request without it;
- `usage` from the last usage seen, with `prompt_tokens_details` and
  `completion_tokens_details` null (counted from the ids when the stream had none), and
  `system_fingerprint` from the usage event;
- every other field vLLM writes, null, in vLLM's key order.

`[DONE]` is ignored; an `{"error": ...}` event is kept for `error()`, which the caller checks
before `body()`. Not covered: logprobs (written null) and tool calls; a request that asked for
either is to be relayed as it is, not assembled. What it holds grows with the stream, so
`max_bytes` caps the stream's bytes: past it `feed` raises `AnswerTooLarge`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.stream.splice import CHAT, ENDPOINTS, EventBuffer, event_json


@dataclass(slots=True)
class _Choice:
    text: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] | None = None
    role: str = "assistant"
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class AnswerTooLarge(ValueError):
    """The stream being assembled passed the assembler's `max_bytes`."""


class Assembler:
    """Collects one response's stream events and writes its non-streamed body (the rules are
    in this module's docstring)."""

    __slots__ = (
        "_buffer",
        "_chat",
        "_choices",
        "_created",
        "_error",
        "_fed",
        "_fingerprint",
        "_id",
        "_max_bytes",
        "_model",
        "_prompt_token_ids",
        "_token_ids",
        "_usage",
    )

    def __init__(self, *, endpoint: str, token_ids: bool, max_bytes: int | None = None) -> None:
        """`endpoint`: "completions" or "chat/completions"; `token_ids`: the client asked
        `return_token_ids`; `max_bytes`: the stream's bytes it takes (None: no cap)."""
        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint must be one of {ENDPOINTS}, not {endpoint!r}")
        self._chat = endpoint == CHAT
        self._token_ids = token_ids
        self._buffer = EventBuffer()
        self._id: str | None = None
        self._created = 0
        self._model = ""
        self._choices: dict[int, _Choice] = {}
        self._prompt_token_ids: list[int] | None = None  # chat: top-level in the first event
        self._usage: dict[str, Any] | None = None
        self._fingerprint: Any = None
        self._error: dict[str, Any] | None = None
        self._fed = 0
        self._max_bytes = max_bytes

    def feed(self, events: bytes) -> None:
        """Whole SSE events of the client-shaped stream; an unfinished trailing event is held
        until the rest of it comes. `[DONE]` and events that are not JSON objects are
        ignored. AnswerTooLarge once the stream passed `max_bytes`."""
        fed = self._fed + len(events)
        self._fed = fed
        if self._max_bytes is not None and fed > self._max_bytes:
            raise AnswerTooLarge(
                f"the answer assembled from the backend's stream passed the "
                f"{self._max_bytes}-byte cap (max_held_answer_bytes)"
            )
        for event in self._buffer.feed(events):
            obj = event_json(event)
            if isinstance(obj, dict):
                self._take(obj)

    def error(self) -> dict[str, Any] | None:
        """The first `{"error": ...}` event seen, if any."""
        return self._error

    def body(self) -> bytes:
        """The JSON body vLLM would have answered for the same request with stream=false.
        ValueError when no generation event came."""
        if self._id is None:
            raise ValueError("no generation event to assemble")
        usage = self._final_usage()
        if self._chat:
            return orjson.dumps(
                {
                    "id": self._id,
                    "object": "chat.completion",
                    "created": self._created,
                    "model": self._model,
                    "choices": [self._chat_choice(i, c) for i, c in self._sorted()],
                    "service_tier": None,
                    "system_fingerprint": self._fingerprint,
                    "usage": usage,
                    "prompt_logprobs": None,
                    "prompt_token_ids": self._ids(self._prompt_token_ids),
                    "prompt_text": None,
                    "kv_transfer_params": None,
                    "ec_transfer_params": None,
                    "metrics": None,
                }
            )
        return orjson.dumps(
            {
                "id": self._id,
                "object": "text_completion",
                "created": self._created,
                "model": self._model,
                "choices": [self._completion_choice(i, c) for i, c in self._sorted()],
                "service_tier": None,
                "system_fingerprint": self._fingerprint,
                "usage": usage,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        )

    # ---- reading events ---------------------------------------------------------------------
    def _take(self, obj: dict[str, Any]) -> None:
        if "error" in obj:
            if self._error is None:
                self._error = obj
            return
        choices = obj.get("choices")
        if not isinstance(choices, list):
            return
        if self._id is None and isinstance(obj.get("id"), str):
            self._id = obj["id"]
            self._created = obj.get("created", 0)
            self._model = obj.get("model", "")
        prompt_ids = obj.get("prompt_token_ids")
        if self._prompt_token_ids is None and isinstance(prompt_ids, list):
            self._prompt_token_ids = prompt_ids
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self._usage = usage
        if "system_fingerprint" in obj:
            self._fingerprint = obj["system_fingerprint"]
        for c in choices:
            if isinstance(c, dict):
                self._take_choice(c)

    def _take_choice(self, c: dict[str, Any]) -> None:
        index = c.get("index", 0)
        state = self._choices.get(index)
        if state is None:
            state = self._choices[index] = _Choice()
        if self._chat:
            delta = c.get("delta")
            if isinstance(delta, dict):
                if isinstance(delta.get("role"), str):
                    state.role = delta["role"]
                if isinstance(delta.get("content"), str):
                    state.text.append(delta["content"])
                if isinstance(delta.get("reasoning"), str):
                    state.reasoning.append(delta["reasoning"])
        elif isinstance(c.get("text"), str):
            state.text.append(c["text"])
        ids = c.get("token_ids")
        if isinstance(ids, list):
            state.token_ids.extend(ids)
        prompt_ids = c.get("prompt_token_ids")
        if state.prompt_token_ids is None and isinstance(prompt_ids, list):
            state.prompt_token_ids = prompt_ids
        if c.get("finish_reason") is not None:
            state.finish_reason = c["finish_reason"]
            state.stop_reason = c.get("stop_reason")

    # ---- writing the body -------------------------------------------------------------------
    def _sorted(self) -> list[tuple[int, _Choice]]:
        return sorted(self._choices.items(), key=lambda item: item[0])

    def _ids(self, ids: list[int] | None) -> list[int] | None:
        return ids if self._token_ids else None

    def _final_usage(self) -> dict[str, Any]:
        if self._usage is not None:
            prompt = int(self._usage.get("prompt_tokens", 0))
            completion = int(self._usage.get("completion_tokens", 0))
        else:  # a stream without usage: count what it carried
            first = self._choices.get(0)
            prompt_ids = self._prompt_token_ids or (first.prompt_token_ids if first else None)
            prompt = len(prompt_ids or ())
            completion = sum(len(c.token_ids) for c in self._choices.values())
        return {
            "prompt_tokens": prompt,
            "total_tokens": prompt + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }

    def _completion_choice(self, index: int, c: _Choice) -> dict[str, Any]:
        return {
            "index": index,
            "text": "".join(c.text),
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "token_ids": self._ids(c.token_ids),
            "prompt_logprobs": None,
            "prompt_token_ids": self._ids(c.prompt_token_ids),
            "routed_experts": None,
        }

    def _chat_choice(self, index: int, c: _Choice) -> dict[str, Any]:
        return {
            "index": index,
            "message": {
                "role": c.role,
                "content": "".join(c.text),
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": "".join(c.reasoning) if c.reasoning else None,
            },
            "logprobs": None,
            "finish_reason": c.finish_reason,
            "stop_reason": c.stop_reason,
            "token_ids": self._ids(c.token_ids),
            "routed_experts": None,
        }
