"""The client's headers as a Responses request sends them on to a backend: the end-to-end
ones, by the same rules as the completions and chat path (proxy/request/entry.py), their size
held to the same `max_forwarded_header_bytes`."""

from __future__ import annotations

import os

from proxy.request.entry import (
    _CLIENT_CREDENTIALS,
    _DROP_REQUEST_HEADERS,
    _headers_too_large,
    _without_connection_named,
)

headers_too_large = _headers_too_large  # the 431 past max_forwarded_header_bytes


def forwarded_headers(
    raw: list[tuple[bytes, bytes]], drop_credentials: bool, request_id: str
) -> tuple[list[tuple[bytes, bytes]], int]:
    """The headers to send on, `x-request-id` last (an upstream id made unique per request,
    as vLLM keys its requests by it); and the bytes of the client's among them, counted as the
    completions and chat path counts them for `max_forwarded_header_bytes`."""
    drop = _DROP_REQUEST_HEADERS
    if drop_credentials:
        drop = drop | _CLIENT_CREDENTIALS
    out: list[tuple[bytes, bytes]] = []
    connection: str | None = None
    size = 0
    for k, v in raw:
        name = k.lower()
        if name == b"connection":
            connection = v.decode("latin-1")
        if name not in drop:
            out.append((name, v))
            size += len(k) + len(v) + 4
    if connection is not None:
        out = _without_connection_named(out, connection)
    upstream_id = f"{request_id}-{os.urandom(6).hex()}"
    out.append((b"x-request-id", upstream_id.encode("latin-1")))
    return out, size
