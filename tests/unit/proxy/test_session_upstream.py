"""A request session built on fakes of its ports alone: the proxy's services as
`proxy.ports.RequestServices` names them (the fleet, live table, metrics and health owner
built from their parts, a policy that picks the first candidate) and a stand-in forwarding
client. Answers relayed whole, retries before the first byte, a stream continued on another
backend after its first one broke, and the accounting and live table left clean."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import deque
from collections.abc import Callable, MutableMapping, Sequence
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from fleet.clock import FakeClock
from fleet.live import LiveTable, NotMovable
from fleet.registry import FleetRegistry
from fleet.types import Backend, EngineMetrics, MetricsSnapshot
from policies.metrics import PoolSource
from policies.policy import Decision, RequestContext
from proxy.backends.health import BackendHealth
from proxy.backends.upstream import UpstreamError, UpstreamResponse
from proxy.errors import ProxyError
from proxy.metrics import RouterMetrics
from proxy.ports import RequestServices
from proxy.request.leg_services import LegServices
from proxy.request.session import RequestSession
from proxy.settings import Settings, load_settings
from proxy.stream.continuation import Movability

MODEL = "m"
ORIGINS = ("http://127.0.0.1:9", "http://127.0.0.1:19")

# The stand-in engine's model: the prompt "hello" is these ids, then token i is (100 + i, " ti").
PROMPT_IDS = [11, 12, 13]


def token(i: int) -> tuple[int, str]:
    return 100 + i, f" t{i}"


class FirstCandidate:
    """A policy that picks the first candidate (the fleet's order): deterministic routing."""

    name = "first"

    def pick(self, ctx: RequestContext, candidates: Sequence[Backend], now: float) -> Decision:
        return Decision(target=candidates[0], reason="first candidate")

    def on_backend_removed(self, backend_id: str) -> None:
        pass

    def bind_metrics(self, registry: CollectorRegistry, pools: PoolSource) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {}

    def keeps_programs(self) -> bool:
        return False

    def end_program(self, program_id: str) -> bool:
        return False


class Services:
    """What a request session may use of the proxy (`RequestServices`), without a ProxyCore."""

    def __init__(self, settings: Settings, upstream: FakeUpstream) -> None:
        self.settings = settings
        self.clock = FakeClock()
        self.fleet = FleetRegistry(stale_after=settings.stale_after)
        for spec in settings.backend_specs():
            b = self.fleet.add(spec)
            b.healthy = True
            b.snapshot = MetricsSnapshot(self.clock.now(), EngineMetrics())
        self.live = LiveTable()
        self.metrics = RouterMetrics(CollectorRegistry(), self.fleet.knows_model)
        self.policy = FirstCandidate()
        self.health = BackendHealth(settings, self.fleet, self.live, self.metrics, self.clock)
        self.prompt_tokens = None
        self.tokens = None
        self.request_log = None
        self.grace_over = False
        self._upstream = upstream
        upstream.services = self

    def upstream_pool(self) -> FakeUpstream:
        return self._upstream

    def backend(self, origin: str) -> Backend:
        return next(b for b in self.fleet if b.url == origin)


Outcome = UpstreamError | tuple[int, bytes] | UpstreamResponse


class FakeUpstream:
    """The forwarding client: answers each call with the next scripted outcome (a response
    maker gets the request's body), and records what was asked."""

    def __init__(self, *outcomes: Outcome | Callable[[dict[str, Any]], UpstreamResponse]) -> None:
        self.outcomes = list(outcomes)
        self.services: Services | None = None
        self.asked: list[str] = []  # origins, in order
        self.bodies: list[dict[str, Any]] = []
        self.request_ids: list[bytes] = []
        self.seen_live: list[int] = []  # live entries while each call was made
        self.seen_in_flight: list[int] = []  # the asked backend's in-flight count then

    async def request(
        self,
        origin: str,
        path: str | bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        method: bytes = b"POST",
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        services = self.services
        assert services is not None
        self.asked.append(origin)
        self.bodies.append(orjson.loads(body))
        self.request_ids.append(dict(headers)[b"x-request-id"])
        self.seen_live.append(len(services.live))
        self.seen_in_flight.append(services.backend(origin).load.in_flight)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, UpstreamError):
            raise outcome
        if isinstance(outcome, UpstreamResponse):
            return outcome
        if callable(outcome):
            return outcome(self.bodies[-1])
        status, answer = outcome
        return UpstreamResponse.complete(status, [(b"content-type", b"application/json")], answer)

    def retain_origins(self, keep: set[str]) -> None:
        pass

    async def close(self) -> None:
        pass


def make(*outcomes: Outcome | Callable[[dict[str, Any]], UpstreamResponse]) -> Services:
    settings = load_settings(
        {
            "backends": [{"url": u, "models": [MODEL]} for u in ORIGINS],
            "health_interval": 1000,
            "scrape_interval": 1000,
            "unhealthy_after": 100,
        }
    )
    services = Services(settings, FakeUpstream(*outcomes))
    _: RequestServices = services  # what the session gets: the port, nothing more
    return services


def session(
    services: Services,
    sent: list[MutableMapping[str, Any]],
    movability: Movability | None = None,
    *,
    stream: bool = False,
    **extra: Any,
) -> RequestSession:
    body: dict[str, Any] = {"model": MODEL, "prompt": "hello", "max_tokens": 6, **extra}
    if stream:
        body["stream"] = True
    ctx = RequestContext("r1", "completions", MODEL, body, {}, stream, "hello", 5)

    async def send(message: MutableMapping[str, Any]) -> None:
        if sent and sent[-1]["type"] == "http.response.body" and not sent[-1].get("more_body"):
            # What uvicorn says; the proxy must end a response once.
            raise RuntimeError("Unexpected ASGI message sent, after response already completed")
        sent.append(message)

    return RequestSession(
        services, LegServices(services), "/v1/completions", ctx, orjson.dumps(body),
        [(b"x-request-id", b"up-1")], send, time.perf_counter(), movability,
    )  # fmt: skip


def assert_clean(services: Services) -> None:
    assert len(services.live) == 0
    for b in services.fleet:
        load = b.load
        assert (load.in_flight, load.pending_prefill_tokens, load.running_decodes) == (0, 0, 0)


# --- a streaming stand-in engine


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def completion_stream(body: dict[str, Any], stream_id: str, *, finish: bool = True) -> list[bytes]:
    """The events the stand-in engine streams for `body`: a first request (the prompt "hello")
    starts at token 0, a continuation (prompt ids) after the tokens it carries. Without
    `finish` the last token carries no finish_reason (a stream cut at its limit)."""
    prompt = body["prompt"]
    prompt_ids = PROMPT_IDS if prompt == "hello" else prompt
    start = len(prompt_ids) - len(PROMPT_IDS)
    end = start + body["max_tokens"]
    assert body.get("return_token_ids") is True  # the proxy tracks the tokens it relays
    events = []
    for i in range(start, end):
        tid, text = token(i)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": "length" if finish and i == end - 1 else None,
            "stop_reason": None,
            "prompt_token_ids": prompt_ids if i == start else None,
            "token_ids": [tid],
        }
        events.append(
            sse({"id": stream_id, "object": "text_completion", "created": 1, "model": MODEL,
                 "choices": [choice]})
        )  # fmt: skip
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {
            "prompt_tokens": len(prompt_ids),
            "completion_tokens": end - start,
            "total_tokens": len(prompt_ids) + end - start,
        }
        events.append(
            sse({"id": stream_id, "object": "text_completion", "created": 1, "model": MODEL,
                 "choices": [], "usage": usage})
        )  # fmt: skip
    events.append(b"data: [DONE]\n\n")
    return events


class BrokenStream(UpstreamResponse):
    """A streamed answer whose connection drops after its first `events`."""

    __slots__ = ("_broke", "_script")

    def __init__(self, events: list[bytes]) -> None:
        super().__init__(None)
        self.status = 200
        self.raw_headers = [(b"content-type", b"text/event-stream")]
        self._script = deque(events)
        self._broke = False

    async def __anext__(self) -> bytes:
        if self._script:
            return self._script.popleft()
        # A session that read a broken leg again would loop on its break for ever.
        assert not self._broke, "a broken leg was read again"
        self._broke = True
        raise UpstreamError("disconnect", "connection reset mid-stream")


def breaks_after(n: int) -> Callable[[dict[str, Any]], UpstreamResponse]:
    return lambda body: BrokenStream(completion_stream(body, "cmpl-first")[:n])


def streams_whole(body: dict[str, Any]) -> UpstreamResponse:
    events = b"".join(completion_stream(body, "cmpl-second"))
    return UpstreamResponse.complete(200, [(b"content-type", b"text/event-stream")], events)


def client_events(sent: list[MutableMapping[str, Any]]) -> list[bytes]:
    assert sent[0]["type"] == "http.response.start"
    assert all(m["type"] == "http.response.body" for m in sent[1:])
    assert sent[-1].get("more_body", False) is False  # the body ended, once
    raw = b"".join(m["body"] for m in sent[1:])
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


# --- the tests


async def test_a_non_streamed_answer_is_relayed_whole() -> None:
    services = make((200, b'{"id":"x","choices":[]}'))
    fake = services.upstream_pool()
    sent: list[MutableMapping[str, Any]] = []
    status = await session(services, sent).run()
    assert status == 200
    assert len(fake.asked) == 1
    assert fake.seen_live == [1]  # in the live table while its backend was asked
    assert fake.seen_in_flight == [1]  # and charged on that backend
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
    assert (b"content-length", b"23") in sent[0]["headers"]
    assert sent[1]["body"] == b'{"id":"x","choices":[]}'
    assert services.backend(fake.asked[0]).load.dispatched_total == 1
    assert_clean(services)


@pytest.mark.parametrize(
    "first",
    [UpstreamError("connect", "refused"), (503, b"overloaded")],
    ids=["connect_error", "http_503"],
)
async def test_a_failure_before_the_first_byte_is_retried_on_the_other_backend(
    first: Outcome,
) -> None:
    services = make(first, (200, b'{"from":"second"}'))
    fake = services.upstream_pool()
    sent: list[MutableMapping[str, Any]] = []
    s = session(services, sent)
    status = await s.run()
    assert status == 200
    assert len(fake.asked) == 2
    assert fake.asked[0] != fake.asked[1]  # the retry went to the other backend
    assert s.tried == [services.backend(o).id for o in fake.asked]
    assert fake.request_ids == [b"up-1", b"up-1-1"]  # a retry has an id of its own
    assert sent[1]["body"] == b'{"from":"second"}'  # the second backend's answer
    assert fake.seen_live == [1, 1]
    assert fake.seen_in_flight == [1, 1]  # each attempt charged only where it was sent
    assert sum(b.load.dispatched_total for b in services.fleet) == 2
    assert_clean(services)


async def test_when_every_attempt_fails_the_client_gets_a_502_and_nothing_stays_charged() -> None:
    # 503s say the backends are full, not that the request is at fault: every attempt is made.
    services = make(*[(503, b"overloaded")] * 3)
    fake = services.upstream_pool()
    with pytest.raises(ProxyError) as raised:
        await session(services, []).run()
    assert raised.value.status == 502
    assert len(fake.asked) == 3  # max_attempts
    assert fake.outcomes == []
    assert_clean(services)


async def test_a_request_that_breaks_two_backends_in_a_row_is_not_sent_to_a_third() -> None:
    services = make(*[UpstreamError("disconnect", "reset")] * 3)
    fake = services.upstream_pool()
    with pytest.raises(ProxyError) as raised:
        await session(services, []).run()
    assert raised.value.status == 502
    assert "failed on 2 backends in a row" in raised.value.message
    assert len(fake.asked) == 2  # max_backends_failed_in_a_row, under max_attempts (3)
    assert len(fake.outcomes) == 1  # the third backend was never asked
    assert_clean(services)


async def test_a_stream_broken_mid_way_continues_on_the_other_backend_token_exact() -> None:
    services = make(breaks_after(3), streams_whole)
    fake = services.upstream_pool()
    sent: list[MutableMapping[str, Any]] = []
    s = session(services, sent, Movability(True, True, ""), stream=True)
    status = await s.run()

    assert status == 200
    first, second = (services.backend(o) for o in fake.asked)
    assert first is not second
    # The continuation asked the second backend for the rest, after the tokens relayed.
    assert fake.bodies[1]["prompt"] == [*PROMPT_IDS, 100, 101, 102]
    assert fake.bodies[1]["max_tokens"] == 3
    assert fake.request_ids == [b"up-1", b"up-1-1"]

    events = client_events(sent)
    assert events[-1] == b"data: [DONE]\n\n"
    data = [orjson.loads(e[6:]) for e in events[:-1]]
    texts = [c["text"] for d in data for c in d["choices"]]
    assert texts == [token(i)[1] for i in range(6)]  # every token, once, in order
    assert {d["id"] for d in data} == {"cmpl-first"}  # one stream, as the client sees it
    assert all("token_ids" not in c for d in data for c in d["choices"])  # not asked for
    assert data[-1]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in d for d in data)  # not asked for either

    assert [leg.backend for leg in s.legs] == [first, second]
    view = s.view()
    assert (view["moves"], view["tokens_generated"]) == (1, 6)
    assert [leg["reason"] for leg in view["legs"]] == ["first", "backend_failed"]
    finished = s.finished()  # what the request log keeps
    assert finished.backends == [first.id, second.id]
    assert (finished.moves, finished.completion_tokens, finished.answer) == (1, 6, None)
    assert not first.healthy  # ejected until its next passing health check
    assert first.last_error.startswith("mid_stream")
    assert second.healthy
    assert_clean(services)


async def test_why_a_session_cannot_move() -> None:
    services = make()
    not_generation = session(services, [])
    assert not_generation.movable_reason(planned=True) == "not_generation"
    with pytest.raises(NotMovable) as raised:
        await not_generation.move()
    assert raised.value.reason == "not_generation"

    failover_only = session(services, [], Movability(True, False, "seed"))
    assert failover_only.movable_reason(planned=False) == ""
    assert failover_only.movable_reason(planned=True) == "seed"

    movable = session(services, [], Movability(True, True, ""))
    assert movable.movable_reason(planned=True) == ""
    with pytest.raises(NotMovable) as raised:
        await movable.move()
    assert raised.value.reason == "not_started"  # no leg yet
    with pytest.raises(NotMovable) as raised:
        await movable.move(kind="teleport")
    assert raised.value.reason == "unknown_kind"
    view = movable.view()
    assert (view["movable"], view["not_movable_reason"], view["attempts"]) == (True, None, 0)
    assert view["upstream_request_id"] == "up-1"
    assert view["backend"] == ""


class DownWhileConnecting(FakeUpstream):
    """The first call's backend is found down while its connection is still being made
    (before the request is written); that attempt then waits for a head that never comes
    unless the session interrupts it. Later calls answer as scripted."""

    async def request(
        self,
        origin: str,
        path: str | bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        method: bytes = b"POST",
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        if self.asked:
            return await super().request(origin, path, headers, body, method, on_sent)
        services = self.services
        assert services is not None
        self.asked.append(origin)
        backend = services.backend(origin)
        for entry in services.live.on_backend(backend.id):
            assert entry.waiting_since() is not None  # connecting counts as waiting
            entry.backend_down("found down while connecting")
        resp = UpstreamResponse(None)  # written, no head yet
        assert on_sent is not None
        on_sent(resp)
        await resp.read()  # raises the interrupt; without one this would wait for ever
        raise AssertionError("unreachable: the head never comes")


async def test_a_backend_found_down_while_its_connection_is_made_is_left_once_written() -> None:
    settings = make().settings
    fake = DownWhileConnecting((200, b'{"from":"second"}'))
    services = Services(settings, fake)
    sent: list[MutableMapping[str, Any]] = []
    status = await session(services, sent).run()
    assert status == 200
    assert len(fake.asked) == 2 and fake.asked[0] != fake.asked[1]
    assert sent[1]["body"] == b'{"from":"second"}'
    assert_clean(services)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_finished_request_leaves_nothing_for_the_cyclic_garbage_collector(
    stream: bool,
) -> None:
    """A session and what it owns are freed by reference counting as the request ends: a
    reference cycle through them (the session <-> its mover, say) would leave every request
    to the cyclic collector, which cost 20 us of CPU per request when it happened."""
    services = make(streams_whole if stream else (200, b'{"id":"x","choices":[]}'))
    movability = Movability(True, True, "") if stream else None
    sent: list[MutableMapping[str, Any]] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        assert await session(services, sent, movability, stream=stream).run() == 200
        gc.collect()
        cyclic = {type(o).__name__ for o in gc.garbage}
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert sent  # the request was served
    assert not cyclic & {"RequestSession", "Mover", "Leg", "TokenLedger", "Dispatch"}


# --- streams whose backend stopped without their ending


def body_ends(sent: list[MutableMapping[str, Any]]) -> int:
    """How many times the client's response body was ended: once, or the ASGI server fails."""
    return sum(1 for m in sent[1:] if not m.get("more_body", False))


def stream_data(sent: list[MutableMapping[str, Any]]) -> list[dict[str, Any]]:
    events = client_events(sent)
    assert events[-1] == b"data: [DONE]\n\n"
    assert b"error" not in b"".join(events)
    return [orjson.loads(e[6:]) for e in events[:-1]]


@pytest.mark.parametrize("usage", [False, True], ids=["plain", "include_usage"])
async def test_a_stream_broken_after_its_last_token_ends_once_with_its_usage(
    usage: bool,
) -> None:
    """Every token and the finish_reason arrived, then the connection broke: the client gets
    the usage it asked for and [DONE], and its response ends exactly once."""
    services = make(breaks_after(6))
    fake = services.upstream_pool()
    sent: list[MutableMapping[str, Any]] = []
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    s = session(services, sent, Movability(True, True, ""), stream=True, **extra)
    status = await asyncio.wait_for(s.run(), 10)

    assert status == 200
    assert body_ends(sent) == 1
    assert len(fake.asked) == 1  # nothing was left to continue
    data = stream_data(sent)
    texts = [c["text"] for d in data for c in d["choices"]]
    assert texts == [token(i)[1] for i in range(6)]
    assert data[5]["choices"][0]["finish_reason"] == "length"
    if usage:
        assert data[-1]["choices"] == []
        assert data[-1]["usage"] == {
            "prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6,
        }  # fmt: skip
    else:
        assert len(data) == 6
    assert_clean(services)


async def test_an_answer_assembled_from_a_stream_broken_after_its_last_token_is_whole() -> None:
    """A client that wants the answer whole gets it, once, when the stream the proxy read for it
    broke after its last token."""
    services = make(breaks_after(6))
    sent: list[MutableMapping[str, Any]] = []
    s = session(services, sent, Movability(True, True, ""))
    status = await asyncio.wait_for(s.run(), 10)

    assert status == 200
    assert body_ends(sent) == 1
    answer = orjson.loads(sent[1]["body"])
    assert answer["choices"][0]["text"] == "".join(token(i)[1] for i in range(6))
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 6
    assert_clean(services)


def cut_at_limit(body: dict[str, Any]) -> UpstreamResponse:
    """Every token up to max_tokens, with no finish_reason, usage or [DONE]: then a break."""
    events = completion_stream(body, "cmpl-first", finish=False)
    return BrokenStream([e for e in events if b"[DONE]" not in e and b'"choices":[]' not in e])


@pytest.mark.parametrize("usage", [False, True], ids=["plain", "include_usage"])
async def test_a_stream_cut_at_its_max_tokens_finishes_for_length(usage: bool) -> None:
    services = make(cut_at_limit)
    fake = services.upstream_pool()
    sent: list[MutableMapping[str, Any]] = []
    extra = {"stream_options": {"include_usage": True}} if usage else {}
    s = session(services, sent, Movability(True, True, ""), stream=True, **extra)
    status = await asyncio.wait_for(s.run(), 10)

    assert status == 200
    assert body_ends(sent) == 1
    assert len(fake.asked) == 1  # the limit was reached: nothing to continue
    data = stream_data(sent)
    texts = [c["text"] for d in data for c in d["choices"]]
    assert texts == [token(i)[1] for i in range(6)] + [""]
    final = data[6]
    assert final["id"] == "cmpl-first" and final["object"] == "text_completion"
    assert final["choices"] == [
        {"index": 0, "text": "", "logprobs": None, "finish_reason": "length", "stop_reason": None}
    ]
    if usage:
        assert data[-1]["usage"] == {
            "prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6,
        }  # fmt: skip
    else:
        assert len(data) == 7
    assert_clean(services)


async def test_an_answer_assembled_from_a_stream_cut_at_its_max_tokens_is_whole() -> None:
    services = make(cut_at_limit)
    sent: list[MutableMapping[str, Any]] = []
    status = await asyncio.wait_for(session(services, sent, Movability(True, True, "")).run(), 10)
    assert status == 200
    answer = orjson.loads(sent[1]["body"])
    assert answer["choices"][0]["text"] == "".join(token(i)[1] for i in range(6))
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 6
    assert_clean(services)


@pytest.mark.parametrize(
    ("stream", "movability"),
    [(True, Movability(True, True, "")), (True, None), (False, Movability(True, True, ""))],
    ids=["streamed_movable", "streamed_not_tracked", "assembled"],
)
async def test_a_json_answer_to_a_streamed_request_is_relayed_as_it_is(
    stream: bool, movability: Movability | None
) -> None:
    """A backend that ignores "stream": true answers JSON: that is the answer, whole."""
    answer = b'{"id":"cmpl-json","object":"text_completion","choices":[{"text":" t0"}]}'
    services = make((200, answer))
    fake = services.upstream_pool()
    sent: list[MutableMapping[str, Any]] = []
    s = session(services, sent, movability, stream=stream)
    assert await asyncio.wait_for(s.run(), 10) == 200
    assert len(fake.asked) == 1
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json"
    assert headers[b"content-length"] == b"%d" % len(answer)
    assert sent[1]["body"] == answer
    assert s.finished().answer == answer  # the request log reads its usage
    assert_clean(services)
