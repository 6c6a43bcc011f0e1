"""Property tests of the Anthropic Messages routes: whatever body and headers a client sends,
the proxy answers without a 5xx of its own, its errors are in Anthropic's shape, and a
streamed success is whole events ending in `message_stop` (or an `error` event).

The real proxy on a loopback port in front of a simulated vLLM engine, driven over HTTP/1.1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

from tests.fuzz.live import MODEL, REQUEST_TIMEOUT_S, fuzz_settings, live_proxy
from tests.fuzz.test_generation_fuzz import field, headers, json_values, serialize, small_limit

pytestmark = pytest.mark.fuzz

ROUTES = ("/v1/messages", "/v1/messages/count_tokens")
ERROR_TYPES = {
    "invalid_request_error",
    "authentication_error",
    "permission_error",
    "not_found_error",
    "request_too_large",
    "rate_limit_error",
    "api_error",
    "overloaded_error",
}
_FRAMING = {"content-length", "transfer-encoding", "host"}

text_blocks = st.lists(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}),
    min_size=1,
    max_size=2,
)
content = st.text(max_size=40) | text_blocks
messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": content}),
    min_size=1,
    max_size=3,
)


@st.composite
def request_object(draw: st.DrawFn) -> dict[str, Any]:
    """A Messages request close enough to valid that it often reaches the engine."""
    odds = draw(st.sampled_from([0, 0, 3, 8]))
    body: dict[str, Any] = {}
    for name, strategy in (
        ("model", field(st.just(MODEL), odds)),
        ("messages", field(messages, odds)),
        ("max_tokens", field(small_limit, odds)),
        ("system", field(st.text(max_size=20) | text_blocks, odds)),
        ("stream", field(st.booleans(), odds)),
        ("stop_sequences", field(st.lists(st.text(min_size=1, max_size=3), max_size=2), odds)),
    ):
        if draw(st.integers(0, 5)):  # most fields, most of the time
            body[name] = draw(strategy)
    if odds and draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(json_values)
    return body


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["object"] * 6 + ["value", "bytes", "truncated"]))
    if kind == "value":
        return serialize(draw(json_values), draw(st.booleans()))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    raw = serialize(draw(request_object()), draw(st.booleans()), 200)
    if kind == "truncated" and raw:
        return raw[: draw(st.integers(0, len(raw) - 1))]
    return raw


def assert_anthropic_error(body: bytes, content_type: str) -> None:
    assert content_type.split(";")[0].strip() == "application/json", (content_type, body[:200])
    parsed = json.loads(body)
    assert isinstance(parsed, dict) and set(parsed) == {"type", "error"}, parsed
    assert parsed["type"] == "error", parsed
    error = parsed["error"]
    assert isinstance(error, dict) and set(error) == {"type", "message"}, parsed
    assert error["type"] in ERROR_TYPES and isinstance(error["message"], str), parsed


def assert_message_stream(body: bytes) -> None:
    """Whole events, each `event: NAME` with one JSON object of that type, the last one
    `message_stop` or `error`."""
    assert body.endswith(b"\n\n"), body[-200:]
    names = []
    for block in body.split(b"\n\n")[:-1]:
        lines = block.split(b"\n")
        assert len(lines) == 2, block
        assert lines[0].startswith(b"event: ") and lines[1].startswith(b"data: "), block
        name = lines[0][7:].decode()
        data = json.loads(lines[1][6:])
        assert isinstance(data, dict) and data["type"] == name, block
        names.append(name)
    assert names and names[-1] in ("message_stop", "error"), names


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with live_proxy() as live, httpx.Client(base_url=live.url, timeout=REQUEST_TIMEOUT_S) as c:
        yield c


@fuzz_settings(max_examples=100)
@given(route=st.sampled_from(ROUTES), body=bodies(), sent_headers=headers)
def test_messages_routes_answer_safely(
    client: httpx.Client, route: str, body: bytes, sent_headers: list[tuple[str, bytes]]
) -> None:
    hdrs = [(k.encode(), v) for k, v in sent_headers if k.lower() not in _FRAMING]
    note(f"POST {route} headers={hdrs!r}\nbody={body!r}")
    try:
        r = client.post(route, content=body, headers=hdrs)
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {REQUEST_TIMEOUT_S}s: {route} {body[:200]!r}")
    source = "from the backend" if "x-fleet-backend" in r.headers else "from the proxy"
    event(f"{r.status_code} {source}")
    content_type = r.headers.get("content-type", "")
    assert r.status_code < 500 or "x-fleet-backend" in r.headers, (r.status_code, r.content)
    if r.status_code >= 400:
        assert_anthropic_error(r.content, content_type)
    elif content_type.startswith("text/event-stream"):
        assert_message_stream(r.content)
    else:
        parsed = json.loads(r.content)
        assert (
            "input_tokens" in parsed
            if route.endswith("count_tokens")
            else parsed["type"] == "message"
        )
