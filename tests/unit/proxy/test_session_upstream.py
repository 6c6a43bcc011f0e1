"""A request session driven through a stand-in forwarding client (ProxyCore's `upstream`):
answers relayed whole, retries before the first byte, and the accounting and live table left
clean."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from fleet.clock import FakeClock
from fleet.live import NotMovable
from fleet.types import EngineMetrics, MetricsSnapshot
from policies.policy import RequestContext
from proxy.backends.upstream import UpstreamError, UpstreamPool, UpstreamResponse
from proxy.errors import ProxyError
from proxy.request.leg_services import LegServices
from proxy.request.session import RequestSession
from proxy.serving.wiring import ProxyCore
from proxy.settings import load_settings
from proxy.stream.continuation import Movability

MODEL = "m"
ORIGINS = ("http://127.0.0.1:9", "http://127.0.0.1:19")

Outcome = UpstreamError | tuple[int, bytes]


class FakeUpstream:
    """Answers each call with the next scripted outcome; records what was asked."""

    def __init__(self, core_box: list[ProxyCore], *outcomes: Outcome) -> None:
        self._core = core_box
        self.outcomes = list(outcomes)
        self.asked: list[str] = []  # origins, in order
        self.seen_live: list[int] = []  # live entries while each call was made
        self.seen_in_flight: list[int] = []  # the asked backend's in-flight count then
        self.closed = False

    async def request(
        self,
        origin: str,
        path: str | bytes,
        headers: Sequence[tuple[bytes, bytes]],
        body: bytes,
        method: bytes = b"POST",
        on_sent: Callable[[UpstreamResponse], None] | None = None,
    ) -> UpstreamResponse:
        core = self._core[0]
        self.asked.append(origin)
        self.seen_live.append(len(core.live))
        backend = next(b for b in core.fleet if b.url == origin)
        self.seen_in_flight.append(backend.load.in_flight)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, UpstreamError):
            raise outcome
        status, answer = outcome
        return UpstreamResponse.complete(status, [(b"content-type", b"application/json")], answer)

    def retain_origins(self, keep: set[str]) -> None:
        pass

    async def close(self) -> None:
        self.closed = True


def make_core(
    *outcomes: Outcome, upstream: type[FakeUpstream] = FakeUpstream
) -> tuple[ProxyCore, FakeUpstream]:
    box: list[ProxyCore] = []
    fake = upstream(box, *outcomes)
    clock = FakeClock()
    settings = load_settings(
        {
            "backends": [{"url": u, "models": [MODEL]} for u in ORIGINS],
            "health_interval": 1000,
            "scrape_interval": 1000,
            "unhealthy_after": 100,
        }
    )
    core = ProxyCore(settings, clock, upstream=fake)
    box.append(core)
    for b in core.fleet:
        b.healthy = True
        b.snapshot = MetricsSnapshot(clock.now(), EngineMetrics())
    return core, fake


def backend_of(core: ProxyCore, origin: str) -> str:
    return next(b.id for b in core.fleet if b.url == origin)


def session(
    core: ProxyCore, sent: list[dict[str, Any]], movability: Movability | None = None
) -> RequestSession:
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 4}
    ctx = RequestContext("r1", "completions", MODEL, body, {}, False, "hello", 5)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    return RequestSession(
        core, LegServices(core), "/v1/completions", ctx, b'{"model":"m","prompt":"hello"}',
        [(b"x-request-id", b"up-1")], send, time.perf_counter(), movability,
    )  # fmt: skip


def assert_clean(core: ProxyCore) -> None:
    assert len(core.live) == 0
    for b in core.fleet:
        load = b.load
        assert (load.in_flight, load.pending_prefill_tokens, load.running_decodes) == (0, 0, 0)


async def test_start_uses_the_given_upstream_and_stop_closes_it() -> None:
    core, fake = make_core()
    await core.start()
    try:
        assert core.upstream_pool() is fake
    finally:
        await core.stop()
    assert fake.closed


async def test_without_one_start_builds_its_own_pool() -> None:
    core = ProxyCore(load_settings({"backends": [ORIGINS[0]]}), FakeClock())
    with pytest.raises(RuntimeError):
        core.upstream_pool()
    await core.start()
    try:
        assert isinstance(core.upstream_pool(), UpstreamPool)
    finally:
        await core.stop()


async def test_a_non_streamed_answer_is_relayed_whole() -> None:
    core, fake = make_core((200, b'{"id":"x","choices":[]}'))
    await core.start()
    try:
        sent: list[dict[str, Any]] = []
        status = await session(core, sent).run()
    finally:
        await core.stop()
    assert status == 200
    assert len(fake.asked) == 1
    assert fake.seen_live == [1]  # in the live table while its backend was asked
    assert fake.seen_in_flight == [1]  # and charged on that backend
    assert [m["type"] for m in sent] == ["http.response.start", "http.response.body"]
    assert sent[0]["status"] == 200
    assert (b"content-length", b"23") in sent[0]["headers"]
    assert sent[1]["body"] == b'{"id":"x","choices":[]}'
    asked = next(b for b in core.fleet if b.url == fake.asked[0])
    assert asked.load.dispatched_total == 1
    assert_clean(core)


@pytest.mark.parametrize(
    "first",
    [UpstreamError("connect", "refused"), (503, b"overloaded")],
    ids=["connect_error", "http_503"],
)
async def test_a_failure_before_the_first_byte_is_retried_on_the_other_backend(
    first: Outcome,
) -> None:
    core, fake = make_core(first, (200, b'{"from":"second"}'))
    await core.start()
    try:
        sent: list[dict[str, Any]] = []
        s = session(core, sent)
        status = await s.run()
    finally:
        await core.stop()
    assert status == 200
    assert len(fake.asked) == 2
    assert fake.asked[0] != fake.asked[1]  # the retry went to the other backend
    assert s.tried == [backend_of(core, o) for o in fake.asked]
    assert sent[1]["body"] == b'{"from":"second"}'  # the second backend's answer
    assert fake.seen_live == [1, 1]
    assert fake.seen_in_flight == [1, 1]  # each attempt charged only where it was sent
    assert sum(b.load.dispatched_total for b in core.fleet) == 2
    assert_clean(core)


async def test_when_every_attempt_fails_the_client_gets_a_502_and_nothing_stays_charged() -> None:
    core, fake = make_core(*[UpstreamError("disconnect", "reset")] * 3)
    await core.start()
    try:
        with pytest.raises(ProxyError) as raised:
            await session(core, []).run()
    finally:
        await core.stop()
    assert raised.value.status == 502
    assert len(fake.asked) == 3  # max_attempts
    assert fake.outcomes == []
    assert_clean(core)


async def test_why_a_session_cannot_move() -> None:
    core, _ = make_core()
    not_generation = session(core, [])
    assert not_generation.movable_reason(planned=True) == "not_generation"
    with pytest.raises(NotMovable) as raised:
        await not_generation.move()
    assert raised.value.reason == "not_generation"

    failover_only = session(core, [], Movability(True, False, "seed"))
    assert failover_only.movable_reason(planned=False) == ""
    assert failover_only.movable_reason(planned=True) == "seed"

    movable = session(core, [], Movability(True, True, ""))
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
        core = self._core[0]
        self.asked.append(origin)
        backend = next(b for b in core.fleet if b.url == origin)
        for entry in core.live.on_backend(backend.id):
            entry.backend_down("found down while connecting")
        resp = UpstreamResponse(None)  # written, no head yet
        assert on_sent is not None
        on_sent(resp)
        await resp.read()  # raises the interrupt; without one this would wait for ever
        raise AssertionError("unreachable: the head never comes")


async def test_a_backend_found_down_while_its_connection_is_made_is_left_once_written() -> None:
    core, fake = make_core((200, b'{"from":"second"}'), upstream=DownWhileConnecting)
    await core.start()
    try:
        sent: list[dict[str, Any]] = []
        status = await session(core, sent).run()
    finally:
        await core.stop()
    assert status == 200
    assert len(fake.asked) == 2 and fake.asked[0] != fake.asked[1]
    assert sent[1]["body"] == b'{"from":"second"}'
    assert_clean(core)
