"""What every answer of the proxy must look like, whatever it was sent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httptools


def assert_openai_error_body(body: bytes, content_type: str) -> None:
    """`{"error": {"message": str, "type": str, "param": ..., "code": ...}}` as JSON."""
    assert content_type.split(";")[0].strip() == "application/json", (content_type, body[:200])
    parsed = json.loads(body)
    assert_openai_error(parsed)


def assert_openai_error(parsed: Any) -> None:
    assert isinstance(parsed, dict) and set(parsed) == {"error"}, parsed
    error = parsed["error"]
    assert isinstance(error, dict), parsed
    assert {"message", "type", "param", "code"} <= set(error), parsed
    assert isinstance(error["message"], str), parsed
    assert isinstance(error["type"], str) and error["type"], parsed
    assert error["param"] is None or isinstance(error["param"], str), parsed
    assert error["code"] is None or isinstance(error["code"], str | int), parsed


def assert_sse_stream(body: bytes) -> None:
    """Well-formed server-sent events whose last event is `data: [DONE]` or an OpenAI-shaped
    error event; every other data payload is a JSON object."""
    assert body.endswith(b"\n\n"), body[-200:]
    events = [e for e in body.split(b"\n\n") if e]
    assert events, body
    last: bytes | None = None
    for event in events:
        data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        others = [
            line for line in event.split(b"\n") if not line.startswith((b"data:", b":")) and line
        ]
        assert not others, event  # only data lines and comments
        if not data:
            continue  # a comment
        assert len(data) == 1, event
        assert last != b"[DONE]", "an event after [DONE]"
        last = data[0]
        if last != b"[DONE]":
            assert isinstance(json.loads(last), dict), event
    assert last is not None, body
    if last != b"[DONE]":
        assert_openai_error(json.loads(last))


def assert_proxy_answer(
    status: int,
    headers: Mapping[str, str],
    body: bytes,
    *,
    method: str = "POST",
    backends_healthy: bool = True,
) -> None:
    """The proxy's answer on a generation endpoint: no 5xx of its own, OpenAI-shaped errors,
    well-formed streams.

    A backend's answer passed through carries `x-fleet-backend`, whatever its status. The
    proxy's 502 `upstream_error` says backends failed; with `backends_healthy` (fault-free
    engines) it is refused too, since then the proxy sent them something broken."""
    from_backend = "x-fleet-backend" in headers
    content_type = headers.get("content-type", "")
    if status >= 500 and not from_backend:
        upstream = False
        if status == 502 and not backends_healthy:
            parsed = json.loads(body)
            upstream = isinstance(parsed, dict) and parsed["error"]["type"] == "upstream_error"
        assert upstream, (status, dict(headers), body[:300])
    if method == "HEAD":
        return
    if status >= 400:
        assert_openai_error_body(body, content_type)
    elif content_type.startswith("text/event-stream"):
        assert from_backend, dict(headers)
        assert_sse_stream(body)
    else:
        assert from_backend, dict(headers)
        assert content_type.startswith("application/json"), dict(headers)
        assert isinstance(json.loads(body), dict), body[:300]


@dataclass
class WireResponse:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class _Responses:
    """httptools callbacks collecting every response in a byte stream."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.done: list[WireResponse] = []
        self.current: WireResponse | None = None

    def on_message_begin(self) -> None:
        self.current = WireResponse()

    def on_header(self, name: bytes, value: bytes) -> None:
        assert self.current is not None
        self.current.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        assert self.current is not None
        self.current.status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        assert self.current is not None
        self.current.body += body

    def on_message_complete(self) -> None:
        assert self.current is not None
        self.done.append(self.current)
        self.current = None


def parse_responses(raw: bytes) -> list[WireResponse]:
    """The complete responses in `raw`, interim ones (100 Continue) left out; a response cut
    short fails."""
    collector = _Responses()
    collector.parser.feed_data(raw)
    assert collector.current is None, f"a response cut short: {raw[-300:]!r}"
    return [r for r in collector.done if r.status >= 200]


def assert_openai_error_or_closed(raw: bytes) -> None:
    """What the front door owes a malformed request: 4xx answers in the OpenAI JSON shape, or
    a closed connection (`raw` empty, or after the answers)."""
    answers = parse_responses(raw)
    # The text/plain allowance: the one line to remove once parser errors answer JSON.
    for r in answers:
        assert 400 <= r.status < 500, (r.status, r.headers, r.body[:300])
        assert_openai_error_body(r.body, r.headers.get("content-type", ""))
