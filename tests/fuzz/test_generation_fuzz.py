"""Property tests of the generation endpoints: whatever body and headers a client sends, the
proxy answers without a 5xx of its own, its errors are OpenAI-shaped JSON, and a streamed
success is well-formed SSE ending in `data: [DONE]` (or an error event).

The real proxy on a loopback port in front of a simulated vLLM engine, driven over HTTP/1.1.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import event, given, note
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from tests.fuzz.checks import assert_proxy_answer
from tests.fuzz.live import MODEL, REQUEST_TIMEOUT_S, LiveProxy, fuzz_settings, live_proxy
from tests.support.polling import eventually_blocking

pytestmark = pytest.mark.fuzz

ROUTES = ("/v1/completions", "/v1/chat/completions")

# --- JSON values, awkward ones included

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["NaN", "Infinity", "-1e999", "1e999", "", "\x00", "\ud7ff\ue000", "null"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


# Stands for nesting past parser recursion limits, which `serialize` writes out itself.
_DEEP = "\x00deep\x00"


def field(valid: st.SearchStrategy[Any], junk_odds: int) -> st.SearchStrategy[Any]:
    """A value the backend takes, or with odds 1 in `junk_odds` (0: never) anything."""
    if not junk_odds:
        return valid
    return st.integers(1, junk_odds).flatmap(lambda i: json_values if i == 1 else valid)


messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant"]), "content": st.text(max_size=40)}
    ),
    min_size=1,
    max_size=3,
)
small_limit = st.integers(min_value=1, max_value=8)


@st.composite
def request_object(draw: st.DrawFn, chat: bool) -> dict[str, Any]:
    """A request body close enough to valid that it often reaches the backend and succeeds:
    about half the examples keep every field the proxy or engine checks valid."""
    odds = draw(st.sampled_from([0, 0, 3, 8]))
    body: dict[str, Any] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {
        "max_tokens": field(small_limit, odds),
        "n": field(st.just(1), odds),
        "logprobs": field(st.none() | (st.booleans() if chat else st.integers(0, 2)), odds),
        "stop": field(st.none() | st.text(min_size=1, max_size=4), odds),
        "temperature": field(st.floats(0, 2), odds),
        "stream_options": field(st.just({"include_usage": True}), odds),
        "return_token_ids": field(st.booleans(), odds),
        "user": field(st.text(max_size=8), odds),
        "seed": field(st.integers(0, 2**31), odds),
        "ignore_eos": field(st.booleans(), odds),
    }
    if not odds or draw(st.integers(0, 9)):
        body["model"] = draw(field(st.just(MODEL), odds))
    if chat:
        if not odds or draw(st.integers(0, 9)):
            body["messages"] = draw(field(messages, odds))
        # A chat request without a limit would generate up to the context length.
        body["max_completion_tokens"] = draw(small_limit)
    elif not odds or draw(st.integers(0, 9)):
        prompt = st.text(max_size=40) | st.lists(st.integers(0, 1000), min_size=1, max_size=8)
        body["prompt"] = draw(field(prompt, odds))
    if draw(st.integers(0, 2)):
        body["stream"] = draw(field(st.booleans(), odds))
    for name in draw(st.lists(st.sampled_from(sorted(optional)), unique=True, max_size=6)):
        body[name] = draw(optional[name])
    if odds:
        body.update(draw(st.dictionaries(st.text(max_size=10), json_values, max_size=2)))
        if draw(st.integers(0, 9)) == 0:
            body[draw(st.sampled_from(["messages", "prompt", "stop", "user"]))] = _DEEP
    if body.get("stream") is not True:
        body.pop("stream_options", None)  # the engine refuses them then: keep the odds of a 200
    return body


def serialize(value: Any, ascii_only: bool, depth: int = 0) -> bytes:
    # The standard library writes NaN, Infinity and integers past 64 bits, which strict
    # parsers refuse: good inputs here.
    raw = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    if depth:
        deep = b'{"a":' * depth + b"1" + b"}" * depth if depth % 2 else b"[" * depth + b"]" * depth
        raw = raw.replace(json.dumps(_DEEP, ensure_ascii=ascii_only).encode(), deep)
    return raw


@st.composite
def bodies(draw: st.DrawFn, chat: bool) -> bytes:
    kind = draw(st.sampled_from(["object"] * 6 + ["value", "bytes", "truncated"]))
    if kind == "value":
        return serialize(draw(json_values), draw(st.booleans()))
    if kind == "bytes":
        return draw(
            st.binary(max_size=64)
            | st.sampled_from([b"", b"\xff\xfe{", b'{"model": "\xc3\x28"}', b"\xef\xbb\xbf{}"])
        )
    depth = draw(st.integers(100, 3000))
    raw = serialize(draw(request_object(chat)), draw(st.booleans()), depth)
    if kind == "truncated" and raw:
        return raw[: draw(st.integers(0, len(raw) - 1))]
    return raw


# --- headers a client may send (names are tokens, values visible bytes, spaces, tabs)

_TOKEN = string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~"
header_names = st.sampled_from(
    [
        "content-type",
        "accept",
        "accept-encoding",
        "authorization",
        "x-request-id",
        "x-session-id",
        "x-program-id",
        "x-fleet-debug",
        "user-agent",
        "cookie",
        "expect",
        "te",
        "x-forwarded-for",
        "content-encoding",
        "connection",
    ]
) | st.text(_TOKEN, min_size=1, max_size=20)
_VISIBLE = st.integers(0x21, 0x7E) | st.integers(0x80, 0xFF)


@st.composite
def header_values(draw: st.DrawFn) -> bytes:
    special = st.sampled_from(
        [b"1", b"application/json", b"text/plain", b"gzip", b"100-continue", b"close", b"trailers"]
    )
    if draw(st.booleans()):
        return draw(special)
    first = bytes([draw(_VISIBLE)])
    middle = bytes(draw(st.lists(_VISIBLE | st.sampled_from([0x20, 0x09]), max_size=40)))
    return (first + middle + first) if middle else first


headers = st.lists(st.tuples(header_names, header_values()), max_size=6)
# Framing is httpx's: these would contradict it.
_FRAMING = {"content-length", "transfer-encoding", "host"}


@pytest.fixture(
    scope="module",
    # Non-streamed requests relayed whole, or streamed from the engine and assembled.
    params=[{}, {"assemble_non_streamed": True}],
    ids=["relayed", "assembled"],
)
def live(request: pytest.FixtureRequest) -> Iterator[LiveProxy]:
    with live_proxy(**request.param) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def client(live: LiveProxy) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=live.url, timeout=REQUEST_TIMEOUT_S) as c:
        yield c


def _send(
    client: httpx.Client,
    method: str,
    route: str,
    body: bytes,
    sent_headers: list[tuple[str, bytes]],
    chunked: bool,
) -> httpx.Response:
    hdrs = [(k.encode(), v) for k, v in sent_headers if k.lower() not in _FRAMING]
    # Written out here: the failure report's own argument listing is blank once schemathesis
    # (loaded as a pytest plugin) has replaced Hypothesis's printer.
    note(f"{method} {route} chunked={chunked} headers={hdrs!r}\nbody={body!r}")
    content: bytes | Iterator[bytes] = body
    if chunked:
        content = iter([body[i : i + 7] for i in range(0, len(body), 7)] or [b""])
    try:
        return client.request(method, route, content=content, headers=hdrs)
    except httpx.TimeoutException:
        pytest.fail(f"no answer within {REQUEST_TIMEOUT_S}s: {method} {route} {body[:200]!r}")


@fuzz_settings(max_examples=150)
@given(
    route=st.sampled_from(ROUTES),
    data=st.data(),
    sent_headers=headers,
    chunked=st.booleans(),
)
def test_generation_endpoints_answer_safely(
    client: httpx.Client,
    route: str,
    data: st.DataObject,
    sent_headers: list[tuple[str, bytes]],
    chunked: bool,
) -> None:
    body = data.draw(bodies(chat=route.endswith("chat/completions")), label="body")
    r = _send(client, "POST", route, body, sent_headers, chunked)
    # Shown by --hypothesis-show-statistics: how many examples reached the engine.
    source = "from the backend" if "x-fleet-backend" in r.headers else "from the proxy"
    event(f"{r.status_code} {r.headers.get('content-type', '').split(';')[0]} {source}")
    assert_proxy_answer(r.status_code, r.headers, r.content)


@fuzz_settings(max_examples=15)
@given(
    route=st.sampled_from(ROUTES),
    method=st.sampled_from(["GET", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]),
    body=st.binary(max_size=32),
)
def test_other_methods_are_refused_in_openai_shape(
    client: httpx.Client, route: str, method: str, body: bytes
) -> None:
    r = _send(client, method, route, body, [], chunked=False)
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    assert_proxy_answer(r.status_code, r.headers, r.content, method=method)


# Names a client may send that no series may carry: each would add a series for good.
ODD_MODELS = ["no-such-model", "../../etc/passwd", "Ünïcode model", "x" * 300, 'a{b="c"}']


def test_the_proxy_still_serves_after_the_fuzz(client: httpx.Client, live: LiveProxy) -> None:
    # Odd traffic of its own, so the checks below hold whether or not the fuzz ran first:
    # refused models, a stream dropped mid-way, bodies that do not parse.
    for model in ODD_MODELS:
        r = client.post("/v1/completions", json={"model": model, "prompt": "x", "max_tokens": 1})
        assert 400 <= r.status_code < 500, (model, r.status_code, r.text)
        assert_proxy_answer(r.status_code, r.headers, r.content)
    with client.stream(
        "POST",
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}], "stream": True},
        headers={"x-session-id": "s{1}", "x-program-id": "../p"},
    ) as dropped:
        assert dropped.status_code == 200
        next(dropped.iter_raw())
    for junk in (b"{", b"\xff\xfe", b"[]"):
        r = client.post("/v1/completions", content=junk)
        assert_proxy_answer(r.status_code, r.headers, r.content)
    for route, body in (
        ("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
    ):
        r = client.post(route, json={**body, "max_completion_tokens": 3})
        assert r.status_code == 200, r.text
        assert_proxy_answer(r.status_code, r.headers, r.content)

    async def live_requests() -> int:
        return len(live.app.core.live)

    eventually_blocking(
        lambda: live.run(live_requests()) == 0, within=REQUEST_TIMEOUT_S, what="no live request"
    )
    # Label values come from the proxy's own vocabulary, never from what clients sent: else
    # each odd request would add a series for good.
    # `model` is a served model's name (from the backends) or "unknown", whatever the client sent.
    served = {m["id"] for m in client.get("/v1/models").json()["data"]} | {"unknown"}
    metrics = client.get("/metrics").text
    refusals = 0.0
    for family in text_string_to_metric_families(metrics):
        if not family.name.startswith("fleet_proxy_"):
            continue
        for sample in family.samples:
            if sample.name == "fleet_proxy_requests_total" and sample.labels["model"] == "unknown":
                refusals += sample.value
            for name, value in sample.labels.items():
                if name == "model":
                    assert value in served, (sample.name, value)
                elif name not in ("backend", "le", "worker", "workers"):
                    assert re.fullmatch(r"[a-z0-9_/]+", value), (sample.name, name, value)
    # The odd models above were counted, under `unknown`.
    assert refusals >= len(ODD_MODELS)
