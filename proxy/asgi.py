"""ASGI types and the few response helpers every part of the hot path shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from proxy.errors import ProxyError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Response headers that describe the backend's hop only, or that the proxy writes itself.
_DROP_RESPONSE_HEADERS = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"date",
        b"server",
        b"x-request-id",
    }
)


def response_headers(
    raw: list[tuple[bytes, bytes]],
    request_id: str,
    backend_id: str | None,
    *,
    json_body: bool = False,
) -> list[tuple[bytes, bytes]]:
    """The backend's end-to-end headers plus the proxy's own (`x-fleet-backend` unless
    `backend_id` is None). `json_body`: the proxy answers a JSON body it assembled from the
    backend's event stream."""
    drop = _DROP_RESPONSE_HEADERS
    out = [(k.lower(), v) for k, v in raw if k.lower() not in drop]
    for k, v in raw:
        if k.lower() == b"connection":
            # Headers the backend's Connection names are for the proxy's hop only.
            named = {t.strip().lower() for t in v.split(b",")}
            out = [(k2, v2) for k2, v2 in out if k2 not in named]
    if json_body:
        out = [(k, v) for k, v in out if k != b"content-type"]
        out.append((b"content-type", b"application/json"))
    out.append((b"x-request-id", request_id.encode("latin-1")))
    if backend_id is not None:
        out.append((b"x-fleet-backend", backend_id.encode("latin-1")))
    return out


async def send_error(send: Send, error: ProxyError, request_id: str) -> None:
    body = error.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *([(b"x-request-id", request_id.encode("latin-1"))] if request_id else []),
        *error.headers,
    ]
    try:
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except (OSError, RuntimeError):
        pass  # the client is gone; nothing to tell it
