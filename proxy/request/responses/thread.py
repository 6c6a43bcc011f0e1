"""A thread of responses made whole: what `previous_response_id` stands for, expanded into the
input a backend needs, since no backend keeps the thread. Pure: no I/O."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.errors import ProxyError
from proxy.request.responses.store import StoredResponse


def input_items(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request's own input as a list of items (a string is one user message)."""
    given = body.get("input")
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}]
    if isinstance(given, list) and given and all(isinstance(i, dict) for i in given):
        return list(given)
    raise ProxyError(
        400, "'input' must be a string or a non-empty list of input items", param="input"
    )


def expanded_input(
    chain: Sequence[StoredResponse], items: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The whole thread for a backend: each earlier turn's input then its output, oldest
    first (`chain`), then this turn's `items`."""
    out: list[dict[str, Any]] = []
    for turn in chain:
        out.extend(turn.input_items)
        out.extend(turn.output_items)
    out.extend(items)
    return out


def prompt_text(instructions: Any, items: Sequence[dict[str, Any]]) -> str:
    """The thread as text for prefix-aware routing: role, then content text, item by item.
    A thread's next turn starts with this turn's text, so it finds the engine holding it."""
    parts: list[str] = []
    if isinstance(instructions, str) and instructions:
        parts.append("system:" + instructions + "\n")
    for item in items:
        parts.append(str(item.get("role") or item.get("type") or ""))
        parts.append(":")
        content = item.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            for piece in content:
                if isinstance(piece, dict) and isinstance(piece.get("text"), str):
                    parts.append(piece["text"])
        for key in ("arguments", "output"):  # function calls and their results
            value = item.get(key)
            if isinstance(value, str):
                parts.append(value)
        parts.append("\n")
    return "".join(parts)
