"""OpenAI-shaped errors: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

from typing import Literal

import orjson
from pydantic import BaseModel

# What a failure says about the backend: the one vocabulary of the proxy's failure handling,
# its `fleet_proxy_upstream_errors` kind label, outcome-based ejection and `last_error`.
# connect: refused (the backend is down); connect_timeout: no connection in time (busy?);
# io: the connection broke or timed out while answering; status: a retryable 5xx answer;
# mid_stream: the stream broke after output reached the client; stalled: it stopped flowing.
# `proxy.backends.upstream.failure_kind()` is the one place an UpstreamError becomes one of these.
FailureKind = Literal["connect", "connect_timeout", "io", "status", "mid_stream", "stalled"]


class ProxyError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
        headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code if code is not None else status
        self.headers = headers or []

    def body(self) -> bytes:
        return error_body(self.message, self.type, self.param, self.code)


def model_not_found(model: str) -> ProxyError:
    """vLLM's answer for a model it does not serve, as the proxy gives it for the fleet."""
    return ProxyError(
        404,
        f"The model `{model}` does not exist.",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def error_body(message: str, type: str, param: str | None, code: str | int | None) -> bytes:
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


# The backend answers the proxy puts in the OpenAI error shape when they are not in it already:
# the status, and how the wrapped message says what the backend did.
_WRAPPED: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "backend {backend} refused the request to {path}"),
    404: ("not_found_error", "backend {backend} does not serve {path}"),
}


def wraps_status(status: int) -> bool:
    """Whether a backend answer with `status` is put in the OpenAI error shape when needed."""
    return status in _WRAPPED


def openai_shaped(status: int, body: bytes, backend_id: str, path: str) -> bytes | None:
    """A backend's 400 or 404 in the OpenAI error shape, or None when it already is one (or
    the status is another). vLLM answers a path it does not serve with `{"detail": "Not
    Found"}` (FastAPI's shape); other servers, and engines refusing a request before their
    API layer (an oversized header, say), answer plain text; OpenAI clients read
    `error.message`."""
    wrapped = _WRAPPED.get(status)
    if wrapped is None:
        return None
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict):
        error = parsed.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return None
    said = body[:200].decode("utf-8", "replace").strip()
    kind, template = wrapped
    message = template.format(backend=backend_id, path=path) + f": it answered {status}"
    return error_body(message + (f" ({said})" if said else ""), kind, None, status)


def sse_error_event(message: str, code: int = 502) -> bytes:
    """The event that ends a stream whose backend failed after the first byte."""
    return b"data: " + error_body(message, "upstream_error", None, code) + b"\n\n"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | int | None


class ErrorBody(BaseModel):
    """The body of every error answer, as the OpenAPI schema describes it."""

    error: ErrorDetail
