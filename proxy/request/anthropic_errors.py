"""Anthropic's error shape on the Messages API routes.

The proxy writes its own errors in OpenAI's shape; a client of `/v1/messages` reads
`{"type": "error", "error": {"type": ..., "message": ...}}` instead, with the same status.
`AnthropicErrors` puts every error answer of those routes in that shape, whoever wrote it
(the proxy, an admission refusal, a backend): one place, so no path can leak the other shape.
Answers that are not errors pass through it untouched.
"""

from __future__ import annotations

from typing import Any

import orjson

from proxy.asgi import AsgiApp, Message, Receive, Scope, Send

# Anthropic's error types by status (its API's own pairing); other 4xx are invalid requests
# and other 5xx api errors.
_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


_KNOWN = frozenset(_TYPES.values())


def error_type(status: int) -> str:
    """Anthropic's error type for an answer with `status`."""
    found = _TYPES.get(status)
    if found is not None:
        return found
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_error(status: int, message: str) -> bytes:
    """The body of an error answer with `status`, in Anthropic's shape."""
    return orjson.dumps(
        {"type": "error", "error": {"type": error_type(status), "message": message}}
    )


def stream_error_event(message: str) -> bytes:
    """The event that ends a Messages stream whose backend failed after the first byte."""
    error = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"event: error\ndata: " + orjson.dumps(error) + b"\n\n"


def anthropic_shaped(status: int, body: bytes) -> bytes | None:
    """An error answer's body in Anthropic's shape, or None when it is in it already. The
    message is kept: OpenAI's `error.message`, FastAPI's `detail`, a bare `error` string
    (vLLM's refused key), or the text of a body that is not JSON. vLLM's own Messages errors
    are in Anthropic's envelope with its OpenAI error types (`BadRequestError`): they get the
    Anthropic type of their status, as every other error here."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            if parsed.get("type") == "error" and error.get("type") in _KNOWN and len(error) == 2:
                return None
            message: str = error["message"]
        elif isinstance(error, str):
            message = error
        elif isinstance(parsed.get("detail"), str):
            message = parsed["detail"]
        else:
            message = body.decode("utf-8", "replace")
    else:
        message = body.decode("utf-8", "replace").strip() or f"error {status}"
    return anthropic_error(status, message)


# An error answer longer than this is not one to rewrite: it goes on as it came.
MAX_ERROR_BYTES = 1 << 20


class AnthropicErrors:
    """An ASGI app behind which every error answer (status 400 and up) is in Anthropic's
    shape: such an answer's head is held until its body is read, rewritten and sent with it
    (up to `MAX_ERROR_BYTES` held)."""

    __slots__ = ("_app",)

    def __init__(self, app: AsgiApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        held: Message | None = None  # the head of an error answer
        chunks: list[bytes] = []
        size = 0

        async def shaped(message: Message) -> None:
            nonlocal held, size
            if held is not None:
                chunk = message.get("body", b"")
                chunks.append(chunk)
                size += len(chunk)
                if not message.get("more_body", False):
                    head, held = held, None
                    await _send_shaped(send, head, b"".join(chunks))
                elif size > MAX_ERROR_BYTES:
                    head, held = held, None
                    await send(head)
                    await send(
                        {"type": "http.response.body", "body": b"".join(chunks), "more_body": True}
                    )
                return
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message
                return
            await send(message)

        await self._app(scope, receive, shaped)


async def _send_shaped(send: Send, head: Message, body: bytes) -> None:
    status: int = head["status"]
    reshaped = anthropic_shaped(status, body)
    if reshaped is not None:
        body = reshaped
    headers = [
        (k, v)
        for k, v in head.get("headers", [])
        if k.lower() not in (b"content-length", b"content-type")
    ]
    headers.append((b"content-type", b"application/json"))
    headers.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
