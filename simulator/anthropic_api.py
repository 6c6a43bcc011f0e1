"""Anthropic's Messages API as vLLM 0.32 serves it (`/v1/messages`, `/v1/messages/count_tokens`).

vLLM turns a Messages request into the chat request it stands for (the `system` text as a
first system message, text blocks joined), serves that, and writes the chat answer back as a
message or as Anthropic's stream events. So does the simulator: `chat_body` is the first half,
`message` and `MessageEvents` the second. Pure; server.py moves the bytes.
"""

from __future__ import annotations

from typing import Any

import orjson

from simulator.openai_api import ApiError, error_body
from simulator.request import SimRequest

MESSAGES = "messages"  # the answer's shape, beside openai_api's COMPLETIONS and CHAT

# vLLM's mapping of a chat finish reason to a Messages stop reason.
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class MissingField(ApiError):
    """A required field is missing: vLLM's request validation answers before its Messages
    handler, in OpenAI's shape (not Anthropic's), with its own wording."""

    def __init__(self, name: str) -> None:
        super().__init__(
            f"1 validation error:\n  {{'type': 'missing', 'loc': 'body.{name}', "
            "'msg': 'Field required', 'input': '<dict>'}",
            param=f"body.{name}",
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": "Bad Request",
                "param": self.param,
                "code": 400,
            }
        }


def error_answer(error: ApiError) -> dict[str, Any]:
    """What vLLM answers a Messages request that fails with `error`."""
    return error.body() if isinstance(error, MissingField) else anthropic_error_body(error)


def anthropic_error_body(error: ApiError) -> dict[str, Any]:
    """vLLM's Messages error: its OpenAI error's type and message in Anthropic's envelope."""
    inner = error_body(error.message, error.status, error.param)["error"]
    return {"type": "error", "error": {"type": inner["type"], "message": inner["message"]}}


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(f"{where} must be a string or a list of content blocks", param=where)
    parts: list[str] = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text":
            raise ApiError("the simulator serves text content blocks only", param=where)
        parts.append(str(block.get("text", "")))
    return "".join(parts)


def chat_body(body: Any, *, counting: bool = False) -> dict[str, Any]:
    """The chat request a Messages request stands for; `counting`: for count_tokens, which
    needs no `max_tokens`."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    messages = body.get("messages")
    if messages is None:
        raise MissingField("messages")
    if not isinstance(messages, list):
        raise ApiError("messages must be a list", param="messages")
    max_tokens = body.get("max_tokens")
    if not counting and max_tokens is None:
        raise MissingField("max_tokens")
    if not counting and (not isinstance(max_tokens, int) or isinstance(max_tokens, bool)):
        raise ApiError("max_tokens must be an integer", param="max_tokens")
    system: list[str] = []
    if body.get("system"):
        system.append(_text(body["system"], "system"))
    chat: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] needs a role", param="messages")
        text = _text(m.get("content"), f"messages[{i}].content")
        if m["role"] == "system":  # vLLM folds these into the system message too
            system.append(text)
        else:
            chat.append({"role": m["role"], "content": text})
    if system:
        chat.insert(0, {"role": "system", "content": "".join(system)})
    out: dict[str, Any] = {"model": body.get("model"), "messages": chat}
    if counting:
        return out
    out["max_tokens"] = max_tokens
    stop = body.get("stop_sequences")
    if stop is not None:
        out["stop"] = stop
    if body.get("stream") is True:
        out["stream"] = True
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return out


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens}


def message(rid: str, model: str, req: SimRequest) -> dict[str, Any]:
    """A whole answer (vLLM leaves out the fields that are None)."""
    out: dict[str, Any] = {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": req.output_text}] if req.output_text else [],
        "model": model,
        "usage": _usage(len(req.prompt_ids), len(req.output_ids)),
    }
    stop = STOP_REASONS.get(req.finish_reason or "")
    if stop is not None:
        out["stop_reason"] = stop
    return out


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


class MessageEvents:
    """The events of one streamed answer, in vLLM's order: message_start; a text block
    (content_block_start, content_block_delta text_delta..., content_block_stop) once text
    comes; message_delta with the stop reason and usage; message_stop."""

    def __init__(self, rid: str, model: str, prompt_ids: list[int]) -> None:
        self.rid = rid
        self.model = model
        self.input_tokens = len(prompt_ids)
        self.completion_tokens = 0
        self._block_open = False
        self._finish: str | None = None

    def head(self) -> bytes:
        start: dict[str, Any] = {
            "id": self.rid,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": self.model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _usage(self.input_tokens, 0),
        }
        return _event("message_start", {"type": "message_start", "message": start})

    def token_bytes(
        self,
        token_ids: list[int],
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> bytes:
        self.completion_tokens += len(token_ids)
        if finish_reason is not None:
            self._finish = finish_reason
        if not text:
            return b""
        out = b""
        if not self._block_open:
            self._block_open = True
            block = {"type": "text", "text": ""}
            start = {"type": "content_block_start", "content_block": block, "index": 0}
            out = _event("content_block_start", start)
        delta = {"type": "text_delta", "text": text}
        return out + _event(
            "content_block_delta", {"type": "content_block_delta", "delta": delta, "index": 0}
        )

    def tail(self) -> bytes:
        out = b""
        if self._block_open:
            out = _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        delta = {
            "type": "message_delta",
            "delta": {
                "stop_reason": STOP_REASONS.get(self._finish or "stop"),
                "stop_sequence": None,
            },
            "usage": _usage(self.input_tokens, self.completion_tokens),
        }
        return (
            out + _event("message_delta", delta) + _event("message_stop", {"type": "message_stop"})
        )
