"""The moving half of a request session: cutting a stream after the last token its client
received and continuing it on another backend, after a failure or on purpose.

A continuation is a `/v1/completions` request with the prompt's token ids and the generated
ones as its prompt (proxy/stream/continuation.py); its stream is rewritten to look like the first
one (proxy/stream/splice.py). A request that sent nothing to its client yet is simply sent again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import orjson

from fleet.clock import Clock
from fleet.live import MoveResult, NotMovable
from fleet.types import Backend
from policies.policy import Decision, RequestContext
from proxy.asgi import Send
from proxy.backends.accounting import Dispatch
from proxy.backends.disagg import decode_body
from proxy.backends.upstream import UpstreamResponse
from proxy.errors import FailureKind, ProxyError, sse_error_event
from proxy.metrics import RouterMetrics
from proxy.request.legs import CALLER_CHOSEN, Leg, LegOpener, RetryableUpstream
from proxy.settings import Settings
from proxy.stream.assembled_answer import Assembler
from proxy.stream.continuation import continuation_body
from proxy.stream.move_kinds import MoveKind, RequestedKind, choose_kind
from proxy.stream.splice import Splicer, StreamIdentity
from proxy.stream.token_ledger import TokenLedger

log = logging.getLogger("fleet_proxy.moves")

_CONTINUE_PATH = "/v1/completions"
DONE_EVENT = b"data: [DONE]\n\n"
_REQUESTED = frozenset(("auto", "recompute", "handover", "precopy"))


class Break:
    """Why a leg's stream stopped before its end: failed | stalled | moved."""

    __slots__ = ("detail", "kind")

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail


class MoveOrder:
    __slots__ = ("done", "kind", "reason", "staged", "to")

    def __init__(
        self, to: Backend | None, reason: str, kind: MoveKind = "recompute", staged: int = 0
    ) -> None:
        self.to = to
        self.reason = reason
        self.kind = kind
        self.staged = staged  # pre-copy: tokens whose KV sits in `to`'s prefix cache
        self.done: asyncio.Future[MoveResult] = asyncio.get_running_loop().create_future()


class SessionMoves:
    """Mixed into RequestSession (proxy/request/session.py), whose state it works on."""

    # What a move changes; the rest of the session's state is RequestSession's.
    __slots__ = (
        "_cut_at",
        "_opening",
        "_opening_down",
        "_opening_resp",
        "_order",
        "_splicer",
        "_staging",
        "_wait_from",
        "moves",
    )

    # The session's state this half reads (set by RequestSession).
    ctx: RequestContext
    path: str
    headers: list[tuple[bytes, bytes]]
    dispatch: Dispatch
    leg: Leg | None
    legs: list[Leg]
    ledger: TokenLedger | None
    moves: int
    last_sent: float
    first_token_at: float | None
    _settings: Settings
    _metrics: RouterMetrics
    _opener: LegOpener
    _send: Send
    _order: MoveOrder | None
    _staging: bool  # a pre-copy is staging the KV on its target; the stream still flows
    _opening: Backend | None  # the backend a leg is being opened on, before its head came
    _opening_resp: UpstreamResponse | None
    _opening_down: str | None  # that backend was found down before the request was written
    _cut_at: float | None
    _clock: Clock
    _splicer: Splicer | None
    _assembler: Assembler | None
    _strip: bool
    _first_body: bytes

    # The session's own steps this half uses.
    def movable_reason(self, planned: bool) -> str:
        raise NotImplementedError

    def _begin_leg(self, leg: Leg) -> None:
        raise NotImplementedError

    def _close_leg(self) -> None:
        raise NotImplementedError

    def _note_failure(self, e: RetryableUpstream) -> None:
        raise NotImplementedError

    async def _emit(self, out: bytes, final: bool) -> None:
        raise NotImplementedError

    def _closing(self, out: bytes) -> bytes:
        raise NotImplementedError

    def _sent(self, resp: UpstreamResponse) -> None:
        raise NotImplementedError

    def _leg_headers(self) -> list[tuple[bytes, bytes]]:
        raise NotImplementedError

    async def move(
        self, to: Backend | None = None, reason: str = "admin", *, kind: str | None = None
    ) -> MoveResult:
        """Cut the stream after the last token its client received and continue it on `to`
        (None: where the policy chooses), its KV moved as `kind` says (None: the `move_kind`
        setting; proxy/stream/move_kinds.py); resolves once the target sent its first token, the
        move failed, or the request ended first. Raises NotMovable."""
        requested = kind or self._settings.move_kind
        if requested not in _REQUESTED:
            raise NotMovable("unknown_kind")
        leg = self._check_movable(to)
        move_kind, to = self._plan_kind(leg, to, cast("RequestedKind", requested))
        staged = 0
        if move_kind == "precopy":
            assert to is not None
            self._staging = True
            try:
                staged = await self._precopy(leg, to)
            finally:
                self._staging = False
            if not staged:
                move_kind = "recompute"  # the staging failed: a plain move to the same target
            if self.leg is leg and leg.closed and self._cut_at is None and self._opening is None:
                return MoveResult("finished", leg.backend.id, kind=move_kind)
            leg = self._check_movable(to)  # it may have ended, failed or moved meanwhile
        order = MoveOrder(to, reason, move_kind, staged)
        self._order = order
        leg.resp.interrupt(f"moved by the proxy ({reason})")
        return await asyncio.shield(order.done)

    def _check_movable(self, to: Backend | None) -> Leg:
        """The leg a planned move to `to` would cut; raises NotMovable."""
        why = self.movable_reason(planned=True)
        if why:
            raise NotMovable(why)
        if self._order is not None or self._cut_at is not None or self._staging:
            raise NotMovable("move_in_progress")
        leg = self.leg
        if leg is None:
            raise NotMovable("not_started")
        if leg.closed:
            raise NotMovable("move_in_progress")
        if leg.resp.status != 200:
            raise NotMovable("not_streaming")  # an error answer is being relayed whole
        if to is not None and to is leg.backend:
            raise NotMovable("already_there")
        if to is not None and not self._opener.can_take(to, self.ctx.model):
            raise NotMovable("target_unavailable")
        if to is None and not self._opener.has_other(leg.backend, self.ctx.model):
            raise NotMovable("no_other_backend")
        return leg

    def _plan_kind(
        self, source: Leg, to: Backend | None, requested: RequestedKind
    ) -> tuple[MoveKind, Backend | None]:
        """The kind of a planned move, and its target when a pre-copy needs one now."""
        opener = self._opener
        if requested == "recompute" or not opener.transfers_kv(source.backend):
            return "recompute", to
        if to is not None:
            both = opener.transfers_kv(to)
        else:
            both = opener.others_transfer_kv(source.backend, self.ctx.model)
        kind = choose_kind(self._tokens_to_move(), both, self._settings.move_costs(), requested)
        if kind == "precopy" and to is None:
            # Staging needs its target now: the policy's pick, then fixed for this move.
            try:
                decision = opener.choose(self.ctx, {source.backend.id}, first=False)
            except ProxyError:
                return "recompute", None
            if not opener.transfers_kv(decision.target):
                return "recompute", None
            to = decision.target
        return kind, to

    def _tokens_to_move(self) -> int:
        ledger = self.ledger
        if ledger is None:
            return self.ctx.prompt_tokens
        prompt = ledger.prompt_ids()
        return (len(prompt) if prompt is not None else self.ctx.prompt_tokens) + len(
            ledger.generated
        )

    async def _precopy(self, source: Leg, target: Backend) -> int:
        """Stage the KV of prompt + the tokens generated so far in `target`'s prefix cache while
        the source keeps decoding; the tokens staged, 0 when the staging failed."""
        ledger = self.ledger
        assert ledger is not None
        prompt_ids = ledger.prompt_ids()
        if prompt_ids is None:
            return 0
        generated = list(ledger.generated)
        try:
            body = continuation_body(
                self.ctx.endpoint, self.ctx.body, prompt_ids, generated,
                max_model_len=source.backend.max_model_len,
            )  # fmt: skip
        except ValueError:
            return 0
        tokens = len(prompt_ids) + len(generated)
        # Both legs share one request id, as a P/D prefill and decode leg do.
        headers = self._leg_headers()
        opener = self._opener
        kv = await opener.kv_from(source.backend, _CONTINUE_PATH, headers, body, tokens, "precopy")
        if kv is None or not await opener.pull_kv(
            target, _CONTINUE_PATH, headers, body, kv, tokens
        ):
            return 0
        return tokens

    async def _next_leg(self, brk: Break) -> bool:
        """Continue the request after its leg stopped; False when it cannot (the client then
        got an error, or an assembled answer fails)."""
        source = self.leg
        assert source is not None
        order = self._order if brk.kind == "moved" else None
        if brk.kind == "moved" and order is None:
            brk = Break("failed", brk.detail)
        self._close_leg()
        if self._cut_at is not None:
            # The previous move's target broke before its first token.
            self._metrics.count_migration(source.reason, "failed")
            self._metrics.count_migration_kind(source.kind, "failed")
        if order is None:
            self._eject(source.backend, brk)
            reason = "backend_stalled" if brk.kind == "stalled" else "backend_failed"
        else:
            reason = order.reason
        ledger = self.ledger
        if ledger is not None and ledger.finished:
            # Every token reached the client; only the stream's ending was lost.
            await self._synthesize_end()
            self._resolve(MoveResult("finished", source.backend.id))
            return True
        # Nothing reached the client yet: any request can simply be sent again elsewhere.
        restart = not ledger.sent if ledger is not None else self.first_token_at is None
        restart = restart and self.moves < max(1, self._settings.max_moves)
        why = self.movable_reason(planned=order is not None)
        if not restart and (ledger is None or why):
            self._metrics.count_migration(reason, "not_movable")
            return await self._give_up(source, f"{brk.detail}; the request cannot move ({why})")
        return await self._continue(source, ledger, reason, order, restart)

    async def _continue(
        self,
        source: Leg,
        ledger: TokenLedger | None,
        reason: str,
        order: MoveOrder | None,
        restart: bool,
    ) -> bool:
        ctx = self.ctx
        cut_at = self.last_sent or time.perf_counter()
        kind: MoveKind = "recompute" if order is None else order.kind
        kv_body: bytes | None = None
        kv_headers: list[tuple[bytes, bytes]] | None = None
        if restart or ledger is None:
            path, body, prompt_len, tokens = self.path, self._first_body, ctx.prompt_tokens, 0
            kind = "recompute"
        else:
            sent = len(ledger.generated)
            ledger.rewind_to_safe()
            prompt_ids = ledger.prompt_ids()
            generated = ledger.generated
            resent = sent - len(generated)
            if prompt_ids is None:
                self._metrics.count_migration(reason, "not_movable")
                return await self._give_up(source, "the backend returned no prompt token ids")
            try:
                continued = continuation_body(
                    ctx.endpoint,
                    ctx.body,
                    prompt_ids,
                    generated,
                    max_model_len=source.backend.max_model_len,
                )
            except ValueError as e:
                self._metrics.count_migration(reason, "not_movable")
                return await self._give_up(source, f"the request cannot continue: {e}")
            path, body = _CONTINUE_PATH, orjson.dumps(continued)
            prompt_len, tokens = len(prompt_ids) + len(generated), len(generated)
            if kind == "handover":
                # The source's prefix cache still holds the aborted request's blocks: it
                # computes the last few tokens and offers the KV for the target to pull.
                kv_headers = self._leg_headers()
                kv = await self._opener.kv_from(
                    source.backend, path, kv_headers, continued, prompt_len, "handover"
                )
                if kv is not None:
                    kv_body = decode_body(continued, kv)
                else:
                    kind, kv_headers = "recompute", None
        # Backends that broke are out of the candidates until their health check passes.
        required = order.to if order is not None else None
        leg, detail = await self._open_continuation(
            path, body, prompt_len, {source.backend.id}, required, reason, tokens,
            kind=kind, kv_body=kv_body, kv_headers=kv_headers,
        )  # fmt: skip
        if leg is None and order is not None:
            # A planned move must not cost the client its answer: back on the source, which
            # was healthy (a drain only stops new requests).
            leg, detail = await self._open_continuation(
                path, body, prompt_len, set(), source.backend, reason, tokens, force=True
            )
        if leg is None:
            self._metrics.count_migration(reason, "failed")
            self._metrics.count_migration_kind(kind, "failed")
            return await self._give_up(source, f"the request could not continue: {detail}")
        if ledger is None:
            pass  # an untracked stream sent again: relayed as it comes
        elif restart:
            ledger.start_leg(strip=self._strip, chat=ctx.endpoint == "chat/completions")
            self._splicer = None
        else:
            ledger.start_leg(strip=False, chat=False)
            self._splicer = self._make_splicer(ledger, prompt_len - tokens, tokens, resent)
        self.moves += 1
        self._cut_at = cut_at
        moved = 0  # tokens whose KV reached the target without a prefill there
        if leg.kind == "handover":
            moved = prompt_len
        elif leg.kind == "precopy" and order is not None:
            moved = min(order.staged, prompt_len)
        self._metrics.migration_recomputed_tokens.inc(prompt_len - moved)
        log.info(
            "request %s: moved %s -> %s after %d tokens (%s, %s)",
            ctx.request_id, source.backend.id, leg.backend.id, tokens, reason, leg.kind,
        )  # fmt: skip
        return True

    async def _open_continuation(
        self,
        path: str,
        body: bytes,
        prompt_len: int,
        exclude: set[str],
        required: Backend | None,
        reason: str,
        tokens: int,
        *,
        force: bool = False,
        kind: MoveKind = "recompute",
        kv_body: bytes | None = None,
        kv_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> tuple[Leg | None, str]:
        """The next leg, on the policy's choice (or `required`, even one not routable now
        with `force`) outside `exclude`, trying another backend after a failed connection;
        None and why when none answered. `kv_body` (a handover's continuation, sent with
        `kv_headers` first) goes to a target that transfers KV, `body` to any other; a
        pre-copy's KV is only on `required`."""
        detail = "no backend could continue it"
        for _ in range(self._settings.max_attempts):
            try:
                if force and required is not None:
                    decision = Decision(target=required, reason=CALLER_CHOSEN)
                else:
                    decision = self._opener.choose(
                        self.ctx, exclude, first=False, required=required
                    )
            except ProxyError as e:
                return None, e.message
            target = decision.target
            if kind == "handover":
                use_kv = kv_body is not None and self._opener.transfers_kv(target)
                leg_kind: MoveKind = "handover" if use_kv else "recompute"
            else:
                use_kv = False
                leg_kind = "precopy" if kind == "precopy" and target is required else "recompute"
            headers = kv_headers if use_kv and kv_headers is not None else self._leg_headers()
            kv_headers = None  # a retry elsewhere gets an id of its own
            # A target pulling the KV computes next to nothing, as a P/D decode leg.
            self.dispatch.move(target.load, 0 if use_kv else prompt_len)
            self._opening = target
            self._wait_from = self._clock.now()
            try:
                resp = await self._opener.request(
                    target, path, headers, kv_body if use_kv and kv_body else body, self._sent
                )
            except RetryableUpstream as e:
                self._note_failure(e)
                self.dispatch.release()
                exclude.add(target.id)
                detail = str(e)
                if required is not None:
                    return None, detail
                continue
            finally:
                self._opening = self._opening_resp = self._opening_down = None
            if resp.status != 200:
                text = (await resp.read())[:300].decode("utf-8", "replace")
                resp.release()
                self.dispatch.release()
                return None, f"{target.id} answered HTTP {resp.status}: {text}"
            leg = Leg(decision, None, resp, reason, tokens, leg_kind)
            self._begin_leg(leg)
            return leg, ""
        return None, detail

    def _make_splicer(
        self, ledger: TokenLedger, prompt_tokens: int, tokens: int, resent: int
    ) -> Splicer:
        options = self.ctx.body.get("stream_options")
        include_usage = isinstance(options, dict) and options.get("include_usage") is True
        continuous = isinstance(options, dict) and options.get("continuous_usage_stats") is True
        return Splicer(
            endpoint=self.ctx.endpoint,
            identity=StreamIdentity.from_event(ledger.first_event),
            prompt_tokens=prompt_tokens,
            tokens_before=tokens,
            include_usage=include_usage or self._assembler is not None,
            continuous_usage=continuous,
            token_ids=not self._strip,
            resent_ids=resent,
        )

    async def _synthesize_end(self) -> None:
        """The usage event (when the client asked for it) and [DONE] that a stream broken
        after its last token never sent."""
        ledger = self.ledger
        assert ledger is not None
        options = self.ctx.body.get("stream_options")
        wants_usage = self._assembler is not None or (
            isinstance(options, dict) and options.get("include_usage") is True
        )
        out = b""
        if wants_usage and not ledger.usage_seen and ledger.first_event:
            ident = StreamIdentity.from_event(ledger.first_event)
            prompt = ledger.prompt_ids() or []
            completion = len(ledger.generated)
            event: dict[str, Any] = {
                "id": ident.id,
                "object": "chat.completion.chunk"
                if self.ctx.endpoint == "chat/completions"
                else "text_completion",
                "created": ident.created,
                "model": ident.model,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "total_tokens": len(prompt) + completion,
                    "completion_tokens": completion,
                },
            }
            out = b"data: " + orjson.dumps(event) + b"\n\n"
        await self._emit(self._closing(out + DONE_EVENT), True)

    async def _give_up(self, source: Leg, detail: str) -> bool:
        self._resolve(MoveResult("failed", source.backend.id, detail=detail))
        log.warning("request %s: %s", self.ctx.request_id, detail)
        if self._assembler is None:
            message = "the backend failed mid-stream; the response is incomplete"
            if self._settings.error_details:
                message = f"backend {source.backend.id}: {detail}; the response is incomplete"
            await self._send(
                {"type": "http.response.body", "body": sse_error_event(message), "more_body": True}
            )
            await self._send({"type": "http.response.body", "body": b""})
        source.backend.last_error = detail
        return False

    def _resolve(self, result: MoveResult) -> None:
        order = self._order
        if order is None:
            return
        self._order = None
        if not order.done.done():
            order.done.set_result(result)

    def _eject(self, backend: Backend, brk: Break) -> None:
        """Passive ejection: a backend that broke or stalled under a request gets no new ones
        until its next passing health check."""
        kind: FailureKind = "stalled" if brk.kind == "stalled" else "mid_stream"
        log.warning("request %s: %s %s: %s", self.ctx.request_id, backend.id, kind, brk.detail)
        self._opener.failed_mid_stream(backend, kind, brk.detail)
