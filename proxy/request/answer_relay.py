"""Relaying a non-streamed answer too large to hold whole: the bytes read so far, then the rest
as the backend sends them, with its Content-Length when it gave one (else chunked).

Nothing of such an answer can be tried again elsewhere once its head went out: when the
backend breaks mid-way the caller leaves the response unfinished, so that the client's
connection is closed short and it never takes a cut answer for a whole one.
"""

from __future__ import annotations

from proxy.asgi import Send
from proxy.backends.upstream import UpstreamResponse

# The request log reads an answer's usage from its end: this much of a relayed answer is kept.
TAIL_BYTES = 4096


def content_length(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """The Content-Length a backend's answer head gives, if any."""
    for name, value in headers:
        if name.lower() == b"content-length":
            return value
    return None


async def relay_rest(resp: UpstreamResponse, send: Send) -> bytes:
    """Send `resp`'s body as it comes and end the response; return the body's last
    TAIL_BYTES. Raises UpstreamError when the backend breaks first (the response is then
    left unfinished)."""
    previous = last = b""
    async for piece in resp:
        await send({"type": "http.response.body", "body": piece, "more_body": True})
        previous, last = last, piece
    await send({"type": "http.response.body", "body": b""})
    if len(last) >= TAIL_BYTES:
        return last[-TAIL_BYTES:]
    return previous[len(last) - TAIL_BYTES :] + last
