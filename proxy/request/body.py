"""Validation of an OpenAI request body and what routing needs from it, in one pass.

Only the fields the proxy relies on are checked (model, prompt/messages, stream); every other
field, vLLM's own included, is passed on as the client sent it. The original bytes go
through as they are unless the proxy must change the body: then the parsed body is
re-serialised with the change (a model alias, the legs of a prefill/decode pair, a request
made movable, a continuation after a move).
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.errors import ProxyError

# The proxy writes a client's body out again at times (with fields of its own added, or as a
# continuation on another backend), and orjson writes at most 254 levels of nesting.
MAX_NESTING = 200


def parse_object(body: bytes) -> dict[str, Any]:
    if not body:
        raise ProxyError(400, "The request body is empty; expected a JSON object.")
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ProxyError(400, f"The request body is not valid JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise ProxyError(400, "The request body must be a JSON object.")
    # Counting brackets is cheap; only a body with that many can nest that deep.
    if body.count(b"[") + body.count(b"{") > MAX_NESTING and _nests_deeper(parsed, MAX_NESTING):
        raise ProxyError(400, f"The request body nests deeper than {MAX_NESTING} levels.")
    return parsed


def _nests_deeper(value: Any, limit: int) -> bool:
    """Whether objects and arrays nest more than `limit` levels deep in `value`."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > limit:
            return True
        children = v.values() if isinstance(v, dict) else v
        stack.extend((c, depth + 1) for c in children if isinstance(c, dict | list))
    return False


def require_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if model is None:
        raise ProxyError(400, "you must provide a model parameter", param="model")
    if not isinstance(model, str) or not model:
        raise ProxyError(400, "'model' must be a non-empty string", param="model")
    return model


def completion_prompt(body: dict[str, Any]) -> tuple[str, int | None]:
    """The prompt as text for prefix hashing, and its token count when given as token ids."""
    prompt = body.get("prompt")
    if prompt is None:
        raise ProxyError(400, "'prompt' is required", param="prompt")
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt), None
        if all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            # Token ids: a stable text form keeps prefix hashing meaningful.
            return " ".join(map(str, prompt)), len(prompt)
        if all(isinstance(p, list) and all(isinstance(t, int) for t in p) for p in prompt):
            flat = [t for p in prompt for t in p]
            return " ".join(map(str, flat)), len(flat)
    raise ProxyError(
        400,
        "'prompt' must be a string, a list of strings, a list of token ids "
        "or a list of lists of token ids",
        param="prompt",
    )


def chat_prompt(body: dict[str, Any]) -> str:
    """Messages serialized in order (role, then content text) for prefix hashing."""
    messages = body.get("messages")
    if messages is None:
        raise ProxyError(400, "'messages' is required", param="messages")
    if not isinstance(messages, list) or not messages:
        raise ProxyError(400, "'messages' must be a non-empty list", param="messages")
    parts: list[str] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ProxyError(400, f"'messages[{i}]' must be an object", param=f"messages[{i}]")
        role = m.get("role")
        if not isinstance(role, str):
            raise ProxyError(
                400, f"'messages[{i}].role' must be a string", param=f"messages[{i}].role"
            )
        parts.append(role)
        parts.append(":")
        _content_text(m.get("content"), parts)
        parts.append("\n")
    return "".join(parts)


def _content_text(content: Any, parts: list[str]) -> None:
    """A message's text, a string or its text parts (the others carry no prompt text)."""
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        for piece in content:
            if isinstance(piece, dict) and isinstance(piece.get("text"), str):
                parts.append(piece["text"])


_BILLING_HEADER = "x-anthropic-billing-header"


def messages_prompt(body: dict[str, Any]) -> str:
    """An Anthropic Messages request's prompt text for prefix hashing: its `system` as a
    first message, then its messages as chat's are, so one conversation hashes the same
    blocks turn after turn."""
    text = chat_prompt(body)
    system = body.get("system")
    if system is None:
        return text
    if isinstance(system, list):
        # Claude Code's attribution block differs on every request: as vLLM drops it from the
        # prompt, routing leaves it out, or no two requests would share a prefix.
        system = [
            b
            for b in system
            if not (isinstance(b, dict) and str(b.get("text", "")).startswith(_BILLING_HEADER))
        ]
    elif not isinstance(system, str):
        raise ProxyError(400, "'system' must be a string or a list of text blocks", param="system")
    parts = ["system:"]
    _content_text(system, parts)
    parts.append("\n")
    parts.append(text)
    return "".join(parts)


def is_stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream", False)
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise ProxyError(400, "'stream' must be a boolean", param="stream")
    return stream
