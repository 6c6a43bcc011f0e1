"""Malformed HTTP/1.1 at the proxy's front door, over raw sockets: broken request lines, header
syntax, chunked encoding and content lengths.

Each example writes its bytes, half-closes (so a request left incomplete cannot be waited on
for ever) and reads until the proxy closes. The proxy must answer only 4xx (OpenAI-shaped) or
just close, within a bounded time, and serve a normal request on a fresh connection right after.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st

from tests.fuzz.checks import assert_openai_error_or_closed, parse_responses
from tests.fuzz.live import MAX_MODEL_LEN, MODEL, LiveProxy, fuzz_settings, live_proxy
from tests.support.polling import eventually_blocking

pytestmark = pytest.mark.fuzz

# The proxy closes within this after the client's end of the conversation.
CLOSE_WITHIN_S = 5.0
CRLF = b"\r\n"

# A body the proxy refuses (no model): a request that happens to parse still gets a 4xx.
REFUSED_BODY = b'{"prompt": "x"}'
# Targets that answer 4xx to any method: nothing here is served to a plain GET.
TARGETS = [
    b"/v1/completions",
    b"/v1/chat/completions",
    b"/nope",
    b"*",
    b"//",
    b"/%zz",
    b"/../../etc/passwd",
    b"http://x/nope",
    b"/a b",
    b"/\x00",
    b"/\xff",
    b"",
]
METHODS = [b"POST", b"GET", b"PUT", b"DELETE", b"post", b"FOO", b"G\x00T", b"", b"POST\t"]
VERSIONS = [
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"HTTP/1.2",
    b"HTTP/2.0",
    b"HTTP/9.9",
    b"HTTP/1",
    b"http/1.1",
    b"HTTP/1.1 ",
    b"HTTP/1.1\x00",
    b"",
]
# A byte of anything, but not a whole request-line ending.
_junk = st.binary(min_size=1, max_size=12)


@st.composite
def bad_request_lines(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from(METHODS) | _junk.filter(lambda b: b != b"HEAD"))
    target = draw(st.sampled_from(TARGETS) | _junk.map(lambda b: b"/" + b))
    version = draw(st.sampled_from(VERSIONS) | _junk)
    sep = draw(st.sampled_from([b" ", b"  ", b"\t"]))
    eol = draw(st.sampled_from([CRLF, CRLF, b"\n", b"\r"]))
    head = method + sep + target + sep + version + eol
    return head + b"Host: x\r\nContent-Length: %d\r\n\r\n" % len(REFUSED_BODY) + REFUSED_BODY


_header_name = st.sampled_from([b"X-A", b"Host", b"Content-Type", b"Accept"])
_bad_header_lines = st.one_of(
    _header_name.map(lambda n: n + b" x"),  # no colon
    _header_name.map(lambda n: n + b" : x"),  # space before the colon
    st.just(b": x"),  # no name
    st.sampled_from([b" folded", b"\tfolded"]),  # an obsolete line fold
    st.tuples(_header_name, st.sampled_from([*b"\x00\x01\x08\x0b\x0c\x0e\x1f\x7f\r"])).map(
        lambda t: t[0] + b": a" + bytes([t[1]]) + b"b"  # a control byte in a value
    ),
    st.binary(min_size=1, max_size=6).map(lambda b: b"X" + b + b"Y: v"),  # odd bytes in a name
    st.sampled_from(
        [
            b"Content-Length: 1\r\nContent-Length: 2",
            b"Content-Length: 15\r\nTransfer-Encoding: chunked",
            b"Transfer-Encoding: chunked, gzip",
            b"Transfer-Encoding: identity",
            b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
            b"Content-Length: 1 5",
        ]
    ),
)


@st.composite
def bad_header_sections(draw: st.DrawFn) -> bytes:
    good = [b"Host: x", b"Content-Length: %d" % len(REFUSED_BODY), b"Accept: */*"]
    bad = draw(st.lists(_bad_header_lines, min_size=1, max_size=3))
    lines = draw(st.permutations(good + bad))
    eol = draw(st.sampled_from([CRLF, CRLF, b"\n"]))
    route = draw(st.sampled_from(TARGETS[:3]))
    return b"POST " + route + b" HTTP/1.1\r\n" + eol.join(lines) + eol + eol + REFUSED_BODY


_chunk_data = st.sampled_from([b"{", b'"prompt"', b": ", b'"x"', b"}", b"", b"\x00\xff"])


@st.composite
def chunks(draw: st.DrawFn) -> bytes:
    data = draw(_chunk_data)
    size = draw(
        st.sampled_from([b"%x" % len(data)] * 3)
        | st.sampled_from([b"%x" % (len(data) + 3), b"zz", b"-1", b" 2", b"f" * 20, b"", b"0x2"])
    )
    ext = draw(st.sampled_from([b"", b"", b";a=b", b";\x01", b"; a"]))
    end = draw(st.sampled_from([CRLF, CRLF, b"\n", b"", b"XX"]))
    return size + ext + CRLF + data + end


@st.composite
def bad_chunked_bodies(draw: st.DrawFn) -> bytes:
    body = b"".join(draw(st.lists(chunks(), min_size=1, max_size=4)))
    ending = draw(
        st.sampled_from([b"0\r\n\r\n", b"0\r\n\r\n", b"", b"0\r\n", b"0\r\nBad Trailer\r\n\r\n"])
    )
    route = draw(st.sampled_from(TARGETS[:3]))
    return (
        b"POST "
        + route
        + b" HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + body
        + ending
    )


@st.composite
def length_mismatches(draw: st.DrawFn) -> bytes:
    body = draw(
        st.sampled_from([REFUSED_BODY, b"{}", b"", b'{"prompt": "x"}GET / HTTP/1.1\r\n\r\n'])
    )
    declared = draw(
        st.integers(0, 64).filter(lambda n: n != len(body)).map(lambda n: b"%d" % n)
        | st.sampled_from([b"-1", b"+2", b"0x10", b"2, 2", b"99999999999999999999999", b"", b"a"])
    )
    route = draw(st.sampled_from(TARGETS[:3]))
    return (
        b"POST "
        + route
        + b" HTTP/1.1\r\nHost: x\r\nContent-Length: "
        + declared
        + b"\r\n\r\n"
        + body
    )


def exchange(live: LiveProxy, data: bytes, *, half_close: bool = True) -> bytes:
    """Write `data`, then read until the proxy closes; fails past CLOSE_WITHIN_S."""
    deadline = time.monotonic() + CLOSE_WITHIN_S
    with socket.create_connection((live.host, live.port), timeout=CLOSE_WITHIN_S) as s:
        try:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the proxy gave up on the bytes already: what it said is still to be read
        received = b""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                pytest.fail(f"the proxy kept the connection open past {CLOSE_WITHIN_S}s")
            s.settimeout(left)
            try:
                got = s.recv(65536)
            except TimeoutError:
                continue  # the deadline check above fails it
            except ConnectionResetError:
                return received
            if not got:
                return received
            received += got


def assert_still_serves(live: LiveProxy) -> None:
    body = b'{"model": "%s", "prompt": "hi", "max_tokens": 1}' % MODEL.encode()
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    )
    answers = parse_responses(exchange(live, request, half_close=False))
    assert [r.status for r in answers] == [200], answers
    assert "x-fleet-backend" in answers[0].headers


@pytest.fixture(scope="module")
def live() -> Iterator[LiveProxy]:
    with live_proxy() as proxy:
        yield proxy


@fuzz_settings(max_examples=200)
@given(
    data=st.one_of(
        bad_request_lines(), bad_header_sections(), bad_chunked_bodies(), length_mismatches()
    )
)
def test_malformed_http_gets_a_4xx_or_a_close_and_never_a_hang(
    live: LiveProxy, data: bytes
) -> None:
    # Written out here: the failure report's own argument listing is blank once schemathesis
    # (loaded as a pytest plugin) has replaced Hypothesis's printer.
    note(f"sent {data!r}")
    received = exchange(live, data)
    note(f"received {received!r}")
    statuses = [r.status for r in parse_responses(received)]
    event(f"answered {statuses}" if statuses else "closed without an answer")
    assert_openai_error_or_closed(received)
    assert_still_serves(live)


def streamed_request(tail: bytes = b"") -> bytes:
    """A well-framed streamed completion long enough to still be running when its client
    goes, then `tail` on the same connection."""
    body = b'{"model": "%s", "prompt": "hi", "max_tokens": %d, "stream": true}' % (
        MODEL.encode(),
        MAX_MODEL_LEN - 8,
    )
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body + tail
    )


def abandon(live: LiveProxy, data: bytes, *, reset: bool) -> bytes:
    """Write `data`, read the answer's head, then go: with a reset (the socket closed with
    unread data and no linger) or a plain close."""
    with socket.create_connection((live.host, live.port), timeout=CLOSE_WITHIN_S) as s:
        s.sendall(data)
        first = b""
        while b"\r\n\r\n" not in first:  # the socket's timeout bounds each read
            got = s.recv(65536)
            assert got, f"closed before a whole head: {first!r}"
            first += got
        if reset:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return first


def test_no_request_is_left_behind(live: LiveProxy) -> None:
    """Requests that reached an engine, whose clients then went in odd ways mid-stream (a
    reset, a close, garbage pipelined behind the request), all leave the live table."""
    ways = [
        (b"", True),
        (b"", False),
        (b"GARBAGE\r\n\r\n", True),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999\r\n\r\n{", False),
    ]
    for tail, reset in ways:
        first = abandon(live, streamed_request(tail), reset=reset)
        # Served by an engine: the request went through the live table.
        assert first.startswith(b"HTTP/1.1 200"), first[:200]
        assert b"x-fleet-backend" in first.lower(), first[:400]

    async def live_requests() -> int:
        return len(live.app.core.live)

    eventually_blocking(
        lambda: live.run(live_requests()) == 0,
        within=CLOSE_WITHIN_S,
        what="no live request after their clients went",
    )
    assert_still_serves(live)
