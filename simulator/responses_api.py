"""The Responses API (`POST /v1/responses`) as vLLM 0.32 answers it for a plain text model:
its input read as chat messages, its answer one output message with `output_text` content,
its usage counted in `input_tokens` and `output_tokens`. Streamed, it is a series of named
SSE events (`event: response.created` ... `event: response.completed`), with no `[DONE]`.

The engine keeps no stored responses here: a request naming `previous_response_id` is
refused as a vLLM engine without that id refuses it (the proxy expands threads itself).
Pure: builders of bodies and events, no I/O.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson

from simulator.openai_api import ApiError

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})


def chat_body(body: Any) -> dict[str, Any]:
    """The chat request a Responses request stands for: `instructions` as the system message,
    then the input items' messages in order, `max_output_tokens` as `max_tokens`."""
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object")
    previous = body.get("previous_response_id")
    if previous is not None:
        raise ApiError(f"Response with id '{previous}' not found.", status=404)
    messages: list[dict[str, str]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        messages.extend(_message(item, i) for i, item in enumerate(given))
    else:
        raise ApiError("input must be a string or a non-empty list of items", param="input")
    out: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    limit = body.get("max_output_tokens")
    if limit is not None:
        out["max_tokens"] = limit
    return out


def _message(item: Any, i: int) -> dict[str, str]:
    if not isinstance(item, dict) or not isinstance(item.get("role"), str):
        raise ApiError(f"input[{i}] must be a message item with a role", param="input")
    kind = item.get("type", "message")
    if kind != "message":
        raise ApiError(f"input[{i}]: items of type {kind!r} are not supported", param="input")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": item["role"], "content": content}
    if not isinstance(content, list):
        raise ApiError(f"input[{i}].content must be a string or a list", param="input")
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in _TEXT_PARTS:
            raise ApiError(f"input[{i}]: only text content is supported", param="input")
        texts.append(str(part.get("text", "")))
    return {"role": item["role"], "content": "".join(texts)}


def new_ids() -> tuple[str, str]:
    """A response's id and its output message's id, as vLLM makes them."""
    return f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def output_message(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "content": [] if status == "in_progress" else [_text_part(text)],
        "role": "assistant",
        "status": status,
        "type": "message",
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": None}


class ResponseShape:
    """The response object of one request, in its states from queued to completed."""

    def __init__(self, body: dict[str, Any], model: str) -> None:
        self.rid, self.item_id = new_ids()
        self.created = int(time.time())
        self.body = body
        self.model = model

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        use: dict[str, Any] | None,
        incomplete: str | None = None,
    ) -> dict[str, Any]:
        b = self.body
        return {
            "id": self.rid,
            "created_at": self.created,
            "incomplete_details": None if incomplete is None else {"reason": incomplete},
            "instructions": b.get("instructions"),
            "metadata": b.get("metadata"),
            "model": self.model,
            "object": "response",
            "output": output,
            "parallel_tool_calls": b.get("parallel_tool_calls", True),
            "temperature": b.get("temperature", 1.0),
            "tool_choice": b.get("tool_choice", "auto"),
            "tools": b.get("tools", []),
            "top_p": b.get("top_p", 1.0),
            "background": b.get("background", False),
            "max_output_tokens": b.get("max_output_tokens"),
            "max_tool_calls": None,
            "previous_response_id": None,
            "prompt": None,
            "reasoning": None,
            "service_tier": "auto",
            "status": status,
            "text": None,
            "top_logprobs": None,
            "truncation": "disabled",
            "usage": use,
            "user": None,
        }

    def finished(
        self, text: str, finish_reason: str | None, n_in: int, n_out: int
    ) -> dict[str, Any]:
        """The whole answer: `completed`, or `incomplete` when it stopped at its length."""
        incomplete = "max_output_tokens" if finish_reason == "length" else None
        status = "completed" if incomplete is None else "incomplete"
        item = output_message(self.item_id, text, "completed")
        return self.response(status, [item], usage(n_in, n_out), incomplete)


class EventWriter:
    """The named SSE events of one streamed response, numbered in order."""

    def __init__(self, shape: ResponseShape) -> None:
        self.shape = shape
        self._seq = 0
        self._text: list[str] = []

    def _event(self, kind: str, data: dict[str, Any]) -> bytes:
        data = {**data, "type": kind, "sequence_number": self._seq}
        self._seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def opening(self) -> bytes:
        shape = self.shape
        started = shape.response("in_progress", [], None)
        item = output_message(shape.item_id, "", "in_progress")
        part = {"item_id": shape.item_id, "output_index": 0, "content_index": 0}
        return b"".join(
            (
                self._event("response.created", {"response": {**started, "status": "queued"}}),
                self._event("response.in_progress", {"response": started}),
                self._event("response.output_item.added", {"item": item, "output_index": 0}),
                self._event("response.content_part.added", {**part, "part": _text_part("")}),
            )
        )

    def delta(self, text: str) -> bytes:
        self._text.append(text)
        shape = self.shape
        return self._event(
            "response.output_text.delta",
            {
                "item_id": shape.item_id,
                "output_index": 0,
                "content_index": 0,
                "delta": text,
                "logprobs": [],
            },
        )

    def closing(self, finish_reason: str | None, n_in: int, n_out: int) -> bytes:
        shape = self.shape
        text = "".join(self._text)
        part = {"item_id": shape.item_id, "output_index": 0, "content_index": 0}
        final = shape.finished(text, finish_reason, n_in, n_out)
        last = "response.completed" if final["status"] == "completed" else "response.incomplete"
        return b"".join(
            (
                self._event("response.output_text.done", {**part, "text": text, "logprobs": []}),
                self._event("response.content_part.done", {**part, "part": _text_part(text)}),
                self._event(
                    "response.output_item.done", {"item": final["output"][0], "output_index": 0}
                ),
                self._event(last, {"response": final}),
            )
        )
