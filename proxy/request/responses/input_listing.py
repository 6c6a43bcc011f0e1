"""`GET /v1/responses/{id}/input_items`: one page of a stored response's own input items, in
the shape of OpenAI's list (`data`, `first_id`, `last_id`, `has_more`). Pure: no I/O.

The proxy keeps the items as the client sent them, where a message may be a bare string and
carry no id: listed, each has an id (its own, or one made from the response's id and its
place, so that the same item has the same id on every page) and a message's string content
becomes one text part, as OpenAI lists them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qs

from proxy.errors import ProxyError

DEFAULT_LIMIT = 20
MAX_LIMIT = 100


@dataclass(frozen=True, slots=True)
class Page:
    after: str | None = None
    limit: int = DEFAULT_LIMIT
    order: Literal["asc", "desc"] = "desc"  # OpenAI's default: newest first


def page_of(query_string: bytes) -> Page:
    """The page a query asks for (`after`, `limit`, `order`; others, as `include`, are
    ignored); 400 for a value out of range."""
    query = parse_qs(query_string.decode("latin-1"))

    def last(name: str) -> str | None:
        values = query.get(name)
        return values[-1] if values else None

    limit_text = last("limit")
    limit = DEFAULT_LIMIT
    if limit_text is not None:
        if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_LIMIT:
            raise ProxyError(
                400, f"'limit' must be an integer from 1 to {MAX_LIMIT}", param="limit"
            )
        limit = int(limit_text)
    order = last("order") or "desc"
    if order not in ("asc", "desc"):
        raise ProxyError(400, "'order' must be 'asc' or 'desc'", param="order")
    return Page(last("after"), limit, "asc" if order == "asc" else "desc")


def listed(response_id: str, items: list[dict[str, Any]], page: Page) -> dict[str, Any]:
    """The page of `items` (oldest first, as stored) that `page` asks for."""
    shown = [_listed_item(response_id, i, item) for i, item in enumerate(items)]
    if page.order == "desc":
        shown.reverse()
    start = 0
    if page.after is not None:
        ids = [item["id"] for item in shown]
        if page.after not in ids:
            raise ProxyError(
                400, f"no input item with id '{page.after}' in this response", param="after"
            )
        start = ids.index(page.after) + 1
    data = shown[start : start + page.limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + page.limit < len(shown),
    }


def _listed_item(response_id: str, place: int, item: dict[str, Any]) -> dict[str, Any]:
    kind = item.get("type", "message")
    out = {"type": kind, **item}
    if not isinstance(out.get("id"), str):
        prefix = "msg" if kind == "message" else "item"
        out["id"] = f"{prefix}_{response_id.removeprefix('resp_')}_{place}"
    if kind == "message":
        content = out.get("content")
        if isinstance(content, str):
            part = "output_text" if out.get("role") == "assistant" else "input_text"
            out["content"] = [{"type": part, "text": content}]
        out.setdefault("status", "completed")
    return out
