"""A request session: one client request for its whole life, across the backend legs that
serve it.

The session owns what lives as long as the client's request: what was sent to the client, the
accounting on the backend currently serving it, its entry in the live table, its usage and
token ledger. Each backend attempt is a `Leg` (proxy/request/legs.py), and every leg, the first,
its retries and the continuations of a moved stream, is opened by `open_leg`. Moving from one
leg to the next after the first byte is decided by the session's `Mover` (proxy/request/mover.py).

Failure rules:
- before anything reaches the client (connect error, timeout, a 5xx answer, a connection
  dropped while reading a whole answer) the request is tried again on another backend, or on
  a still-healthy one again when none is left, bounded by `max_attempts`;
- a non-streamed answer is read whole up to `hold_answer_bytes`; a larger one is relayed as
  it comes (proxy/request/answer_relay.py), and a backend breaking after that closes the
  client's connection short;
- after that, a movable request whose backend breaks (reset, EOF, a 5xx or an error event mid
  stream) or stalls (no byte for `stall_timeout` once tokens flow) continues on another healthy
  backend from the last token its client received, at most `max_moves` times; the broken or
  stalled backend is ejected until its next passing health check. A request that cannot move,
  or that finds no backend to continue on, ends with an OpenAI-style error event;
- a planned `move()` cuts the stream the same way, closes the source's connection (vLLM then
  aborts the request there) and continues on the chosen target;
- a client that goes away cancels the session; closing the upstream connection makes vLLM
  abort the request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from enum import Enum
from typing import Any

import orjson

from fleet.live import MoveResult, NotMovable
from fleet.types import Backend
from policies.policy import RequestContext
from proxy.asgi import Send, response_headers
from proxy.backends.accounting import Dispatch
from proxy.backends.upstream import UpstreamError, UpstreamResponse, failure_kind
from proxy.errors import FailureKind, ProxyError, openai_shaped, sse_error_event, wraps_status
from proxy.ports import FinishedRequest, FlowTicket, RequestServices
from proxy.request.answer_relay import content_length, relay_rest
from proxy.request.anthropic_errors import stream_error_event
from proxy.request.leg_services import LegServices
from proxy.request.legs import Leg, receipt_header
from proxy.request.mover import Break, Mover, Splice
from proxy.request.retries import tried_again
from proxy.request.routes import POOLING_ENDPOINTS, not_a_pooling_model
from proxy.request.tracking import lost_ending, spliced_stream, tracked_request
from proxy.request.upstream_failures import (
    RETRYABLE_STATUS,
    RetryableUpstream,
    failed_in_a_row,
    failed_in_a_row_error,
    refused,
    report_failure,
    report_suspect,
)
from proxy.stream.assembled_answer import AnswerTooLarge
from proxy.stream.continuation import Movability
from proxy.stream.messages_stream import MessagesAligner
from proxy.stream.splice import Splicer
from proxy.stream.sse import DONE_EVENT, ERROR_EVENT_START
from proxy.stream.token_ledger import EventAligner, EventTooLarge

log = logging.getLogger("fleet_proxy.session")


class _Relayed(Enum):
    """The first leg's answer is too large to hold: it is relayed as it comes."""

    ANSWER = 1


RELAYED = _Relayed.ANSWER


class RequestSession:
    __slots__ = (
        "_assembler",
        "_body_fields",
        "_charge",
        "_clock",
        "_core",
        "_failed_in_row",
        "_leg_live",
        "_legs",
        "_metrics",
        "_mover",
        "_opened",
        "_opening",
        "_opening_down",
        "_opening_resp",
        "_relaying",
        "_send",
        "_settings",
        "_splicer",
        "_strip",
        "_wait_from",
        "answer",
        "answer_headers",
        "arrived",
        "avoid",
        "ctx",
        "dispatch",
        "first_body",
        "first_token_at",
        "headers",
        "last_sent",
        "ledger",
        "leg",
        "legs",
        "path",
        "stopped",
        "tried",
    )

    def __init__(
        self,
        core: RequestServices,
        legs: LegServices,
        path: str,
        ctx: RequestContext,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        send: Send,
        arrived: float,
        movability: Movability | None,
    ) -> None:
        self._core = core
        self._clock = core.clock
        self._settings = core.settings
        self._metrics = core.metrics
        self._legs = legs
        self.path = path
        self.ctx = ctx
        self.headers = headers  # end-to-end headers for every backend, x-request-id last
        self._opened = 0  # legs opened (or tried): each gets its own upstream request id
        self._wait_from = 0.0  # clock time the current leg was sent: its wait for output
        self._send = send
        self.arrived = arrived
        # The backend a leg is being opened on, before its answer's head arrived.
        self._opening: Backend | None = None
        self._opening_resp: UpstreamResponse | None = None
        self._opening_down: str | None = None  # it was found down before the request was written
        self.dispatch = Dispatch(None, 0)
        self.tried: list[str] = []  # backend ids of first-leg attempts, in order
        # Backends flow control saw with no room: the first leg goes elsewhere if it can.
        self.avoid: tuple[str, ...] = ()
        self._failed_in_row = 0  # backends that failed under this request one after another
        # The error that stopped the request after too many of those: it goes to no other.
        self.stopped: ProxyError | None = None
        self.legs: list[Leg] = []  # every leg that answered, in order
        self.leg: Leg | None = None  # the leg serving the request now
        self._leg_live = False  # the current leg has produced output
        self._relaying = False  # a whole answer too large to hold is being relayed
        self.first_token_at: float | None = None
        self.last_sent = 0.0
        self._splicer: Splicer | None = None
        self._charge = ctx.prompt_tokens
        client_ids = ctx.body.get("return_token_ids") is True
        self._strip = not client_ids
        self.first_body, self._body_fields, self.ledger, self._assembler = tracked_request(
            ctx, body, movability, client_ids, self._settings.max_held_answer_bytes
        )
        # An answer relayed whole, or the end of one relayed as it came: the request log reads
        # its usage there.
        self.answer: bytes | None = None
        # Headers every answer of this request carries besides the backend's (a rate-limited
        # tenant's quota).
        self.answer_headers: Sequence[tuple[bytes, bytes]] = ()
        # The mover is handed the session per call, never keeps it: a reference back would
        # make every request a cycle for the garbage collector (~20 us of CPU per request).
        self._mover = Mover(core, legs, ctx, self.ledger, movability)

    # --- what the live table and the admin API read

    @property
    def request_id(self) -> str:
        return self.ctx.request_id

    @property
    def backend_id(self) -> str:
        opening = self._opening
        if opening is not None:
            return opening.id
        leg = self.leg
        return leg.backend.id if leg is not None else ""

    @property
    def upstream_request_id(self) -> str:
        return self.headers[-1][1].decode("latin-1")

    @property
    def arrived_at(self) -> float:
        # `arrived` is perf_counter time (the latency metrics'); the view wants clock time.
        return self._clock.now() - (time.perf_counter() - self.arrived)

    @property
    def running(self) -> bool:
        return self._leg_live

    @property
    def charged_prompt_tokens(self) -> int:
        return self._charge

    @property
    def tokens_generated(self) -> int:
        ledger = self.ledger
        return len(ledger.generated) if ledger is not None else 0

    def let_through(self, ticket: FlowTicket) -> None:
        """Flow control let the request through with `ticket`: its first leg passes over the
        backends it saw with no room, and its answer carries the tenant's rate-limit headers."""
        self.avoid = ticket.avoid
        if ticket.rate is not None:
            self.answer_headers = ticket.rate.headers

    def movable_reason(self, planned: bool) -> str:
        if self._relaying:
            return "not_streaming"  # a whole answer has no token to cut it after
        return self._mover.movable_reason(planned)

    async def move(
        self,
        to: Backend | None = None,
        reason: str = "admin",
        *,
        kind: str | None = None,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> MoveResult:
        """Cut the stream after the last token its client received and continue it on `to`
        (None: where the policy chooses), its KV moved as `kind` says (None: the `move_kind`
        setting; proxy/stream/move_kinds.py); resolves once the target sent its first token, the
        move failed, or the request ended first. `hold`: a suspension, see LiveEntry.move.
        Raises NotMovable."""
        if self._relaying:
            raise NotMovable("not_streaming")
        return await self._mover.move(self, to, reason, kind, hold)

    def view(self) -> dict[str, Any]:
        ledger = self.ledger
        why = self.movable_reason(planned=False)
        return {
            "request_id": self.ctx.request_id,
            "upstream_request_id": self.upstream_request_id,
            "endpoint": self.ctx.endpoint,
            "model": self.ctx.model,
            "backend": self.backend_id,
            "stream": self.ctx.stream,
            "charged_prompt_tokens": self._charge,
            "token_events": ledger.token_events if ledger is not None else None,
            "tokens_generated": len(ledger.generated) if ledger is not None else None,
            "attempts": len(self.tried),
            "first_token": self.first_token_at is not None,
            "movable": why == "",
            "not_movable_reason": why or None,
            "moves": self._mover.moves,
            "legs": [leg.receipt() for leg in self.legs],
        }

    def finished(self) -> FinishedRequest:
        """What the request log keeps of this request, read as it ends."""
        ctx = self.ctx
        first = self.first_token_at
        ledger = self.ledger
        return FinishedRequest(
            ctx.model,
            ctx.stream,
            [leg.backend.id for leg in self.legs],
            len(self.tried),
            self._mover.moves,
            None if first is None else first - self.arrived,
            ctx.prompt_tokens,
            self.answer,
            len(ledger.generated) if ledger is not None and ledger.token_events else None,
        )

    def backend_down(self, why: str) -> None:
        if self._opening is not None:
            if self._opening_resp is not None:
                self._opening_resp.interrupt(why)  # still waiting for the answer's head
            else:
                # Still connecting: the request must not go on to wait there once written.
                self._opening_down = why
            return
        leg = self.leg
        if leg is not None and not leg.closed and not self._mover.ordered:
            leg.resp.interrupt(why)

    def waiting_since(self) -> float | None:
        if self._leg_live:
            return None
        if self._opening is None and (self.leg is None or self.leg.closed):
            return None  # between legs
        return self._wait_from

    def last_read(self) -> float:
        if self._opening is not None:
            resp = self._opening_resp
        else:
            leg = self.leg
            resp = leg.resp if leg is not None and not leg.closed else None
        return resp.last_read if resp is not None else 0.0

    # --- opening legs: the first, its retries and the continuations of a moved stream

    @property
    def opening(self) -> bool:
        return self._opening is not None

    def leg_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers of the next leg: after the first, its x-request-id gets a suffix, so a
        retry or a continuation never shares an id with a request an engine may still hold
        (a P/D prefill leg shares its decode leg's id, as the KV transfer expects)."""
        n = self._opened
        self._opened = n + 1
        headers = self.headers
        if n == 0:
            return headers
        name, value = headers[-1]
        return [*headers[:-1], (name, b"%s-%d" % (value, n))]

    async def open_leg(
        self,
        backend: Backend,
        path: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
        charge: int,
    ) -> UpstreamResponse:
        """Send a leg's request to `backend`, the request's accounting moved there with
        `charge` prompt tokens to compute. Until its answer's head comes the request is
        `opening` there, and `backend_down` interrupts it. Raises RetryableUpstream (nothing
        stays charged then)."""
        self.dispatch.move(backend.load, charge)
        self._opening = backend
        self._wait_from = self._clock.now()
        origin, full_path = self._legs.targets.target(backend, path)
        try:
            resp = await self._core.upstream_pool().request(
                origin, full_path, headers, body, on_sent=self._sent
            )
            if resp.status in RETRYABLE_STATUS:
                raise await refused(backend, resp)
        except UpstreamError as e:
            self.dispatch.release()
            raise RetryableUpstream(backend, failure_kind(e), str(e)) from None
        except BaseException:
            self.dispatch.release()
            raise
        finally:
            self._opening = self._opening_resp = self._opening_down = None
        return resp

    def _sent(self, resp: UpstreamResponse) -> None:
        self._opening_resp = resp
        if self._opening_down is not None:
            resp.interrupt(self._opening_down)

    def note_failure(self, e: RetryableUpstream, stage: str = "first") -> ProxyError | None:
        """Report a leg that failed before its answer (`stage`: of the first leg or of a
        continuation); the error to end the request with when it has now made
        `max_backends_failed_in_a_row` backends fail in a row, else None."""
        before = self._failed_in_row
        failed = self._failed_in_row = failed_in_a_row(before, e.kind, e.status)
        if before and failed > before:
            report_suspect(self._core.health, self.ctx.request_id, e.backend, e.kind, str(e))
        else:
            report_failure(
                self._core.health, self.ctx.request_id, e, len(self.tried),
                time.perf_counter() - self.arrived,
            )  # fmt: skip
        return self._stop_after(failed, stage, str(e))

    def note_break(
        self, backend: Backend, kind: FailureKind, detail: str, had_output: bool
    ) -> bool:
        """Report a leg whose stream broke or stalled; True when the request must stop here
        (`stopped` says why). A leg that had sent its client output shows the request can be
        served: its failure is the backend's, and the run starts again."""
        if had_output:
            self._failed_in_row = 0
            self._core.health.failed_mid_stream(backend, kind, detail)
            return False
        before = self._failed_in_row
        failed = self._failed_in_row = before + 1
        if before:
            report_suspect(self._core.health, self.ctx.request_id, backend, kind, detail)
        else:
            self._core.health.failed_mid_stream(backend, kind, detail)
        return self._stop_after(failed, "continuation", f"{backend.id}: {detail}") is not None

    def _stop_after(self, failed: int, stage: str, last: str) -> ProxyError | None:
        limit = self._settings.max_backends_failed_in_a_row
        if not limit or failed < limit:
            return None
        self._metrics.failed_in_a_row.labels(stage).inc()
        log.warning(
            "request %s: %d backends failed under it in a row; not sent to another",
            self.ctx.request_id, failed,
        )  # fmt: skip
        self.stopped = failed_in_a_row_error(failed, last if self._settings.error_details else None)
        return self.stopped

    # --- the request's life

    async def run(self) -> int:
        core = self._core
        core.live.add(self)
        try:
            leg, whole = await self._open_first()
            return await self._serve(leg, whole)
        finally:
            self.close_leg()
            self.dispatch.release()
            core.live.remove(self)
            self._mover.ended(self.backend_id)

    async def _open_first(self) -> tuple[Leg, bytes | _Relayed | None]:
        try:
            return await self._attempt_first()
        except RetryableUpstream as e:
            stop = self.note_failure(e)
            if stop is not None:
                raise stop from None
            first = e
        return await tried_again(
            self._attempt_first, first, self.note_failure, self.tried, self._settings, self._metrics
        )

    async def _attempt_first(self) -> tuple[Leg, bytes | _Relayed | None]:
        """Open the first leg; answers the proxy relays whole are read here, so a break
        while reading one can still be retried: up to `hold_answer_bytes` (RELAYED when
        larger), or `max_held_answer_bytes` for one that may need the OpenAI error shape."""
        ctx = self.ctx
        legs = self._legs
        decision = legs.chooser.choose(ctx, self.tried, first=True, avoid=self.avoid)
        backend = decision.target
        self.tried.append(backend.id)
        headers = self.leg_headers()
        if decision.prefill is None:  # the common case, without a coroutine call
            prefill, body, charge = None, self.first_body, None
        else:
            prefill, body, headers, charge = await legs.kv.prefill_elsewhere(
                ctx, decision, self.path, self.first_body, self._body_fields, headers
            )
        if charge is None:
            # What the policy expects the backend to compute (its uncached part), else all.
            charge = decision.prefill_tokens
            if charge is None:
                charge = ctx.prompt_tokens
        self._charge = charge
        resp = await self.open_leg(backend, self.path, headers, body, charge)
        leg = Leg(decision, prefill, resp, "first", 0)
        self._begin_leg(leg)
        streams = resp.status == 200 and (ctx.stream or self._assembler is not None)
        # A backend may ignore "stream": a JSON answer is whole, and relayed as it is.
        if streams and not _json_answer(resp.raw_headers):
            return leg, None
        settings = self._settings
        shaped = wraps_status(resp.status)
        try:
            whole = await resp.read_within(
                settings.max_held_answer_bytes if shaped else settings.hold_answer_bytes
            )
        except UpstreamError as e:
            self.close_leg()
            self.dispatch.release()
            raise RetryableUpstream(backend, failure_kind(e), str(e)) from None
        self._core.health.succeeded(backend)
        if whole is None:
            if shaped:
                raise ProxyError(
                    502,
                    f"the backend's {resp.status} answer is over the "
                    f"{settings.max_held_answer_bytes}-byte cap (max_held_answer_bytes)",
                    type="upstream_error",
                    code=502,
                )
            return leg, RELAYED
        return leg, whole

    async def _serve(self, leg: Leg, whole: bytes | _Relayed | None) -> int:
        ctx = self.ctx
        resp = leg.resp
        status = resp.status
        if whole is RELAYED:
            status = await self._relay_answer(leg)
        elif whole is not None:
            # Only on a 400 or 404: a dict lookup, the body is read only then.
            shaped = (
                openai_shaped(status, whole, leg.backend.id, self.path)
                if wraps_status(status)
                else None
            )
            if shaped is not None:
                whole = shaped
                if status == 404 and ctx.endpoint in POOLING_ENDPOINTS:
                    status, whole = 400, not_a_pooling_model(ctx.model, self.path)
            self.answer = whole
            self.dispatch.prefilled()
            headers = self._headers(leg, json_body=shaped is not None)
            headers.append((b"content-length", b"%d" % len(whole)))
            await self._send({"type": "http.response.start", "status": status, "headers": headers})
            await self._send({"type": "http.response.body", "body": whole})
        elif ctx.stream:
            await self._send(
                {"type": "http.response.start", "status": status, "headers": self._headers(leg)}
            )
            await self._stream()
        else:
            status = await self._answer_assembled()
        self._metrics.observe_duration(ctx.endpoint, ctx.model, time.perf_counter() - self.arrived)
        return status

    async def _relay_answer(self, leg: Leg) -> int:
        """An answer too large to hold, relayed as it comes; its status, or 502 when the
        backend broke mid-way (the client's connection is then closed short)."""
        resp = leg.resp
        self.dispatch.prefilled()
        self._leg_live = True  # its bytes flow: the request waits for no first output
        self._relaying = True
        headers = self._headers(leg)
        length = content_length(resp.raw_headers)
        if length is not None:
            headers.append((b"content-length", length))
        await self._send({"type": "http.response.start", "status": resp.status, "headers": headers})
        try:
            self.answer = await relay_rest(resp, self._send)
        except UpstreamError as e:
            backend = leg.backend
            log.warning(
                "request %s: %s broke after part of its answer was relayed; the client's "
                "connection is closed short: %s", self.ctx.request_id, backend.id, e,
            )  # fmt: skip
            if e.kind != "interrupted":  # found down already: nothing more to tell
                kind: FailureKind = "stalled" if e.kind == "timeout" else "mid_stream"
                self._core.health.failed_mid_stream(backend, kind, str(e))
            return 502
        return resp.status

    def _headers(self, leg: Leg, *, json_body: bool = False) -> list[tuple[bytes, bytes]]:
        ctx = self.ctx
        named = self._settings.backend_header
        out = response_headers(
            leg.resp.raw_headers, ctx.request_id, leg.backend.id if named else None,
            json_body=json_body,
        )  # fmt: skip
        if leg.prefill is not None and named:
            out.append((b"x-fleet-prefill", leg.prefill.id.encode("latin-1")))
        if self.answer_headers:
            out.extend(self.answer_headers)
        if ctx.debug:
            out.append((b"x-fleet-decision", receipt_header(self.legs[0].decision)))
            if len(self.legs) > 1:
                out.append((b"x-fleet-legs", orjson.dumps([g.receipt() for g in self.legs])))
        return out

    # --- relaying

    async def _stream(self) -> bool:
        """Relay legs until the stream ends; True when it ended complete."""
        while True:
            leg = self.leg
            assert leg is not None
            brk = await self._relay(leg)
            if brk is None:
                return True
            after = await self._mover.next_leg(self, brk)
            if after != "continued":
                # Ended: its lost ending was sent, or an error was.
                return after == "ended"

    async def _relay(self, leg: Leg) -> Break | None:
        """This leg's events to the client; None once the response is complete."""
        resp = leg.resp
        ledger = self.ledger
        aligner: EventAligner | None = None
        if ledger is not None:
            ledger.events.max_event_bytes = self._settings.max_sse_event_bytes
            feed = ledger.feed
        else:
            limit = self._settings.max_sse_event_bytes
            # A Messages stream's aligner also notes whether its last event ended it.
            messages = self.ctx.endpoint == "messages"
            aligner = MessagesAligner(limit) if messages else EventAligner(limit)
            feed = aligner.feed
        splicer = self._splicer
        assembler = self._assembler
        send = self._send
        clock = time.perf_counter
        try:
            async for chunk in resp:
                out = feed(chunk)
                if not out:
                    continue
                if ledger is not None and ledger.error_event:
                    # The backend gave up mid-stream: its error event is not the client's end
                    # while another backend can continue.
                    cut = out.find(ERROR_EVENT_START)
                    if cut > 0:
                        await self._pass(leg, out[:cut], splicer)
                    return Break("failed", "the backend sent an error event mid-stream")
                if splicer is not None:
                    out = splicer.rewrite(out)
                    if not out:
                        continue
                if not self._leg_live:
                    self._first_output(leg)
                if resp.at_end and (ledger is None or ledger.done):
                    if _cut_short(aligner):
                        await self._emit(out, False)
                        return Break("failed", _NO_MESSAGE_STOP)
                    if aligner is not None and aligner.tail:
                        out += aligner.tail  # not SSE after all: relay every byte
                    await self._emit(self._closing(out), True)
                    return None
                # Inlined _emit(out, False): one coroutine less per chunk.
                if assembler is None:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                else:
                    assembler.feed(out)
                self.last_sent = clock()
        except UpstreamError as e:
            if e.kind == "interrupted":
                return Break("moved", str(e))
            if e.kind == "timeout" and self._leg_live:
                return Break("stalled", str(e))
            return Break("failed", str(e))
        except EventTooLarge as e:
            # A backend that never ends its event: fail the leg rather than buffer it all.
            return Break("failed", str(e))
        if ledger is None or ledger.done:
            if _cut_short(aligner):
                return Break("failed", _NO_MESSAGE_STOP)
            await self._emit(self._closing(aligner.tail if aligner is not None else b""), True)
            return None
        return Break("failed", "the stream ended without its [DONE]")

    async def _pass(self, leg: Leg, out: bytes, splicer: Splicer | None) -> None:
        if splicer is not None:
            out = splicer.rewrite(out)
        if out:
            if not self._leg_live:
                self._first_output(leg)
            await self._emit(out, False)
            self.last_sent = time.perf_counter()

    def _closing(self, out: bytes) -> bytes:
        """The last bytes of a stream; a debug request's stream gets its legs as an SSE
        comment (ignored by SSE clients) before its [DONE] (after it, when [DONE] is gone)."""
        if not self.ctx.debug or self._assembler is not None:
            return out
        note = b": x-fleet-legs " + orjson.dumps([g.receipt() for g in self.legs]) + b"\n\n"
        if out.endswith(DONE_EVENT):
            return out[: -len(DONE_EVENT)] + note + DONE_EVENT
        return out + note  # [DONE] went out with an earlier chunk

    async def _emit(self, out: bytes, final: bool) -> None:
        assembler = self._assembler
        if assembler is not None:
            assembler.feed(out)
        elif final:
            await self._send({"type": "http.response.body", "body": out})
        else:
            await self._send({"type": "http.response.body", "body": out, "more_body": True})

    def _first_output(self, leg: Leg) -> None:
        """The current leg's first bytes reached the client."""
        self._leg_live = True
        now = time.perf_counter()
        self.dispatch.first_token()
        self._core.health.succeeded(leg.backend)
        if self.first_token_at is None:
            self.first_token_at = now
            self._metrics.observe_ttft(self.ctx.endpoint, self.ctx.model, now - self.arrived)
        if self.ledger is not None:
            # Tokens flow: from now on a silent backend is a stalled one.
            leg.resp.set_read_timeout(self._settings.stall_timeout)
        self._mover.leg_started(leg, now)

    async def _answer_assembled(self) -> int:
        assembler = self._assembler
        assert assembler is not None
        try:
            complete = await self._stream()
        except AnswerTooLarge as e:
            raise ProxyError(502, str(e), type="upstream_error", code=502) from None
        if not complete:
            if self.stopped is not None:
                raise self.stopped
            message = "the backends failed before the answer was complete"
            if self._settings.error_details and self.legs:
                message += ": " + self.legs[-1].backend.last_error
            raise ProxyError(502, message, type="upstream_error", code=502)
        body = assembler.body()
        leg = self.leg
        assert leg is not None
        headers = self._headers(leg, json_body=True)
        headers.append((b"content-length", b"%d" % len(body)))
        await self._send({"type": "http.response.start", "status": 200, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})
        return 200

    # --- the legs after the first (their moves are the mover's)

    def continue_on(self, leg: Leg, splice: Splice | None) -> None:
        """`leg` serves the request from now on: its stream joins the client's where `splice`
        says, or from its start (None: the request was sent again)."""
        self._begin_leg(leg)
        ledger = self.ledger
        if ledger is None:
            return  # an untracked stream sent again: relayed as it comes
        if splice is None:
            ledger.start_leg(strip=self._strip, chat=self.ctx.endpoint == "chat/completions")
            self._splicer = None
        else:
            ledger.start_leg(strip=False, chat=False)
            self._splicer = spliced_stream(
                self.ctx, ledger, *splice, assembled=self._assembler is not None, strip=self._strip
            )

    async def end_stream(self, at_limit: bool) -> None:
        """The ending a stream broken after its last token never sent: a last event finishing
        it for "length" when it stopped at its limit without one (`at_limit`), the usage event
        when the client asked for it, and [DONE]."""
        ledger = self.ledger
        assert ledger is not None
        lost = lost_ending(
            self.ctx, ledger, assembled=self._assembler is not None, strip=self._strip,
            at_limit=at_limit,
        )  # fmt: skip
        await self._emit(self._closing(lost + DONE_EVENT), True)

    async def end_with_error(self, message: str) -> None:
        """End a stream that cannot go on with an error event; an answer being assembled
        fails instead (its caller answers with an error)."""
        if self._assembler is None:
            event = (
                stream_error_event(message)
                if self.ctx.endpoint == "messages"
                else sse_error_event(message)
            )
            await self._send({"type": "http.response.body", "body": event, "more_body": True})
            await self._send({"type": "http.response.body", "body": b""})

    # --- bookkeeping

    def _begin_leg(self, leg: Leg) -> None:
        self.leg = leg
        self.legs.append(leg)
        self._leg_live = False

    def close_leg(self) -> None:
        """Done with the current leg (it stays `self.leg`, for the view and the headers)."""
        leg = self.leg
        if leg is None or leg.closed:
            return
        leg.closed = True
        leg.resp.release()  # closes an unfinished response: the backend aborts it
        self._leg_live = False


_NO_MESSAGE_STOP = "the stream ended without its message_stop"


def _cut_short(aligner: EventAligner | None) -> bool:
    """A Messages stream that ended, its connection closed cleanly, before its last event."""
    return isinstance(aligner, MessagesAligner) and not aligner.complete


def _json_answer(headers: list[tuple[bytes, bytes]]) -> bool:
    """The answer's head says JSON: a whole answer, not an event stream."""
    for name, value in headers:
        if name.lower() == b"content-type":
            return value[:16].lower() == b"application/json"
    return False
