"""Moving a request session's stream: cutting it after the last token its client received and
continuing it on another backend, after a failure or on purpose.

A continuation is a `/v1/completions` request with the prompt's token ids and the generated
ones as its prompt (proxy/stream/continuation.py); its stream is rewritten to look like the first
one (proxy/stream/splice.py). A request that sent nothing to its client yet is simply sent again.
The session owns its `Mover` and opens every leg itself; the mover decides where and how.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, Protocol, cast

import orjson

from fleet.live import MoveResult, NotMovable
from fleet.types import Backend
from policies.policy import Decision, RequestContext
from proxy.backends.accounting import Dispatch
from proxy.backends.disagg import decode_body
from proxy.backends.upstream import UpstreamResponse
from proxy.errors import FailureKind, ProxyError
from proxy.ports import RequestServices
from proxy.request.choosing import CALLER_CHOSEN
from proxy.request.kv_moves import CONTINUE_PATH, moves_kv, planned_kind, precopy
from proxy.request.leg_services import LegServices
from proxy.request.legs import Leg
from proxy.request.upstream_failures import RetryableUpstream, error_detail
from proxy.stream.continuation import Movability, continuation_body, tokens_left
from proxy.stream.move_kinds import MoveKind, RequestedKind
from proxy.stream.token_ledger import TokenLedger

log = logging.getLogger("fleet_proxy.moves")

_REQUESTED = frozenset(("auto", "recompute", "handover", "precopy"))

# What became of a request whose leg stopped: it goes on on a new leg, it ended complete (every
# token had reached the client; the ending it lost was sent), or it failed (the client got an
# error event, or an assembled answer fails).
After = Literal["continued", "ended", "failed"]


class Break:
    """Why a leg's stream stopped before its end: failed | stalled | moved."""

    __slots__ = ("detail", "kind")

    def __init__(self, kind: str, detail: str) -> None:
        self.kind = kind
        self.detail = detail


class MoveOrder:
    __slots__ = ("done", "hold", "kind", "reason", "staged", "to")

    def __init__(
        self,
        to: Backend | None,
        reason: str,
        kind: MoveKind = "recompute",
        staged: int = 0,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.to = to
        self.reason = reason
        self.kind = kind
        self.staged = staged  # pre-copy: tokens whose KV sits in `to`'s prefix cache
        # A suspension: awaited between the cut and the continuation (flow control's queue).
        self.hold = hold
        self.done: asyncio.Future[MoveResult] = asyncio.get_running_loop().create_future()


# Where a continuation's stream joins the client's: the prompt tokens of the first request, the
# generated tokens the client had, and those of them the backend sends again.
Splice = tuple[int, int, int]


class MovingSession(Protocol):
    """What a mover needs of the session whose stream it moves."""

    @property
    def leg(self) -> Leg | None:
        """The leg serving the request now (kept, closed, between legs)."""

    @property
    def opening(self) -> bool:
        """A leg is being opened: its answer's head has not come yet."""

    @property
    def running(self) -> bool:
        """The current leg has sent its client output."""

    @property
    def stopped(self) -> ProxyError | None:
        """Why the request goes to no other backend: it made too many fail in a row."""

    @property
    def dispatch(self) -> Dispatch: ...

    @property
    def path(self) -> str: ...

    @property
    def first_body(self) -> bytes:
        """The first leg's body: a request that reached its client nothing is sent again."""

    @property
    def first_token_at(self) -> float | None: ...

    @property
    def last_sent(self) -> float:
        """perf_counter time of the last bytes relayed to the client; 0 before."""

    def leg_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers of the next leg, with an upstream request id of its own."""

    async def open_leg(
        self, backend: Backend, path: str, headers: list[tuple[bytes, bytes]], body: bytes,
        charge: int,
    ) -> UpstreamResponse:  # fmt: skip
        """Send a leg's request; raises RetryableUpstream (nothing stays charged then)."""

    def continue_on(self, leg: Leg, splice: Splice | None) -> None:
        """`leg` serves the request from now on; None: from the start of its stream."""

    def close_leg(self) -> None: ...

    def note_failure(self, e: RetryableUpstream, stage: str = "first") -> ProxyError | None:
        """Report a failure before a leg's answer; the error that stops the request, if any."""

    def note_break(
        self, backend: Backend, kind: FailureKind, detail: str, had_output: bool
    ) -> bool:
        """Report a leg whose stream broke or stalled; True when the request must stop."""

    async def end_stream(self, at_limit: bool) -> None:
        """Send the ending (usage, [DONE]) of a stream whose every token was relayed;
        `at_limit`: it stopped at its limit without a finish_reason, which the ending gives."""

    async def end_with_error(self, message: str) -> None:
        """End a stream that cannot go on with an error event."""


class _Resume:
    """The request that resumes a stream on its next leg."""

    __slots__ = ("body", "kind", "kv_body", "kv_headers", "path", "prompt_len", "resent", "tokens")

    def __init__(
        self, path: str, body: bytes, prompt_len: int, tokens: int, resent: int, kind: MoveKind
    ) -> None:
        self.path = path
        self.body = body
        self.prompt_len = prompt_len  # what the target computes (its prompt)
        self.tokens = tokens  # generated tokens the client had
        self.resent = resent  # of those, the ones the target sends again
        self.kind = kind
        # A handover's body that pulls the KV from the source, and the headers of its KV leg.
        self.kv_body: bytes | None = None
        self.kv_headers: list[tuple[bytes, bytes]] | None = None


class Mover:
    """The moves of one request session: planned ones (`move`) and the continuation after a
    leg broke (`next_leg`)."""

    __slots__ = (
        "_core",
        "_ctx",
        "_cut_at",
        "_cut_from",
        "_ledger",
        "_legs",
        "_movability",
        "_order",
        "_returned",
        "_staging",
        "moves",
    )

    def __init__(
        self,
        core: RequestServices,
        legs: LegServices,
        ctx: RequestContext,
        ledger: TokenLedger | None,
        movability: Movability | None,
    ) -> None:
        self._core = core
        self._legs = legs
        self._ctx = ctx
        self._ledger = ledger
        self._movability = movability
        self.moves = 0
        self._order: MoveOrder | None = None
        self._staging = False  # a pre-copy is staging the KV on its target; the stream flows
        self._cut_at: float | None = None  # when the stream was cut for a move in progress
        self._cut_from = ""  # the backend it was cut on
        # Why a planned move's target could not take the request, which went back to its
        # source; "" while the move is on course.
        self._returned = ""

    @property
    def ordered(self) -> bool:
        """A planned move cuts the stream now."""
        return self._order is not None

    def movable_reason(self, planned: bool) -> str:
        m = self._movability
        if m is None:
            return "not_generation"
        if not m.movable:
            return m.reason
        if planned and not m.planned:
            return m.reason
        ledger = self._ledger
        if ledger is not None and ledger.not_movable:
            return ledger.not_movable
        if self.moves >= self._core.settings.max_moves:
            return "move_limit"
        return ""

    def ended(self, backend_id: str) -> None:
        """The request ended: a move still waiting learns it finished first."""
        order = self._order
        if order is not None and not order.done.done():
            order.done.set_result(MoveResult("finished", backend_id))

    # --- a planned move

    async def move(
        self,
        session: MovingSession,
        to: Backend | None,
        reason: str,
        kind: str | None,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> MoveResult:
        """See fleet.live.LiveEntry.move."""
        if hold is not None:
            # A suspension recomputes wherever it resumes: its source's KV will be gone.
            leg = self._check_movable(session, None, anywhere=True)
            order = MoveOrder(None, reason, "recompute", hold=hold)
            self._order = order
            leg.resp.interrupt(f"suspended by the proxy ({reason})")
            return await asyncio.shield(order.done)
        requested = kind or self._core.settings.move_kind
        if requested not in _REQUESTED:
            raise NotMovable("unknown_kind")
        leg = self._check_movable(session, to)
        move_kind, to = planned_kind(
            self._legs.chooser, self._ctx, self._ledger, self._core.settings.move_costs(),
            leg.backend, to, cast("RequestedKind", requested),
        )  # fmt: skip
        staged = 0
        if move_kind == "precopy":
            assert to is not None
            self._staging = True
            try:
                assert self._ledger is not None
                staged = await precopy(
                    self._legs.kv, self._ctx, self._ledger, leg.backend, to,
                    session.leg_headers,
                )  # fmt: skip
            finally:
                self._staging = False
            if not staged:
                move_kind = "recompute"  # the staging failed: a plain move to the same target
            if session.leg is leg and leg.closed and self._cut_at is None and not session.opening:
                return MoveResult("finished", leg.backend.id, kind=move_kind)
            leg = self._check_movable(session, to)  # it may have ended, failed or moved meanwhile
        order = MoveOrder(to, reason, move_kind, staged)
        self._order = order
        leg.resp.interrupt(f"moved by the proxy ({reason})")
        return await asyncio.shield(order.done)

    def _check_movable(
        self, session: MovingSession, to: Backend | None, *, anywhere: bool = False
    ) -> Leg:
        """The leg a planned move to `to` would cut; raises NotMovable. `anywhere`: it may
        continue on its own backend too."""
        why = self.movable_reason(planned=True)
        if why:
            raise NotMovable(why)
        if self._order is not None or self._cut_at is not None or self._staging:
            raise NotMovable("move_in_progress")
        leg = session.leg
        if leg is None:
            raise NotMovable("not_started")
        if leg.closed:
            raise NotMovable("move_in_progress")
        if leg.resp.status != 200:
            raise NotMovable("not_streaming")  # an error answer is being relayed whole
        if to is not None and to is leg.backend:
            raise NotMovable("already_there")
        chooser = self._legs.chooser
        if to is not None and not chooser.can_take(to, self._ctx.model):
            raise NotMovable("target_unavailable")
        if to is None and not anywhere and not chooser.has_other(leg.backend, self._ctx.model):
            raise NotMovable("no_other_backend")
        return leg

    # --- after a leg stopped

    async def next_leg(self, session: MovingSession, brk: Break) -> After:
        """Continue the request after its leg stopped, or end it (see `After`)."""
        source = session.leg
        assert source is not None
        metrics = self._core.metrics
        order = self._order if brk.kind == "moved" else None
        if brk.kind == "moved" and order is None:
            brk = Break("failed", brk.detail)
        had_output = session.running
        session.close_leg()
        if self._cut_at is not None:
            # The previous move's target broke before its first token.
            metrics.count_migration(source.reason, "failed")
            metrics.count_migration_kind(source.kind, "failed")
        if order is None:
            self._eject(session, source.backend, brk, had_output)
            reason = "backend_stalled" if brk.kind == "stalled" else "backend_failed"
        else:
            reason = order.reason
        ledger = self._ledger
        if ledger is not None:
            finished = ledger.finished
            if finished or self._at_limit(ledger, source.backend):
                # Every token reached the client; only the stream's ending was lost.
                await session.end_stream(at_limit=not finished)
                self._resolve(MoveResult("finished", source.backend.id))
                return "ended"
        if session.stopped is not None:
            metrics.count_migration(reason, "failed")
            return await self._give_up(session, source, session.stopped.message)
        # Nothing reached the client yet: any request can simply be sent again elsewhere.
        restart = not ledger.sent if ledger is not None else session.first_token_at is None
        restart = restart and self.moves < max(1, self._core.settings.max_moves)
        why = self.movable_reason(planned=order is not None)
        if not restart and (ledger is None or why):
            metrics.count_migration(reason, "not_movable")
            return await self._give_up(
                session, source, f"{brk.detail}; the request cannot move ({why})"
            )
        return await self._continue(session, source, ledger, reason, order, restart)

    async def _continue(
        self,
        session: MovingSession,
        source: Leg,
        ledger: TokenLedger | None,
        reason: str,
        order: MoveOrder | None,
        restart: bool,
    ) -> After:
        metrics = self._core.metrics
        cut_at = session.last_sent or time.perf_counter()
        if restart or ledger is None:
            resume: _Resume | str = _Resume(
                session.path, session.first_body, self._ctx.prompt_tokens, 0, 0, "recompute"
            )
        else:
            resume = await self._resumption(session, source, ledger, order)
        if isinstance(resume, str):
            metrics.count_migration(reason, "not_movable")
            return await self._give_up(session, source, resume)
        # Backends that broke are out of the candidates until their health check passes; a
        # suspended request's own backend is as good as any.
        exclude = {source.backend.id}
        if order is not None and order.hold is not None:
            session.dispatch.release()  # suspended: it holds no backend until it continues
            try:
                await order.hold()
            except ProxyError as e:
                metrics.count_migration(reason, "failed")
                return await self._give_up(session, source, e.message)
            exclude = set()
        required = order.to if order is not None else None
        leg, detail = await self._open(session, resume, exclude, required, reason, resume.kind)
        returned = ""
        if leg is None and order is not None and session.stopped is None:
            # A planned move must not cost the client its answer: back on the source, which
            # was healthy (a drain only stops new requests).
            returned = detail
            leg, detail = await self._open(
                session, resume, set(), source.backend, reason, "recompute", force=True
            )
        if leg is None:
            metrics.count_migration(reason, "failed")
            metrics.count_migration_kind(resume.kind, "failed")
            return await self._give_up(session, source, f"the request could not continue: {detail}")
        prompt_len, tokens = resume.prompt_len, resume.tokens
        splice = None if restart else (prompt_len - tokens, tokens, resume.resent)
        session.continue_on(leg, splice)
        self.moves += 1
        self._cut_at = cut_at
        self._cut_from = source.backend.id
        self._returned = returned
        moved = 0  # tokens whose KV reached the target without a prefill there
        if leg.kind == "handover":
            moved = prompt_len
        elif leg.kind == "precopy" and order is not None:
            moved = min(order.staged, prompt_len)
        metrics.migration_recomputed_tokens.inc(prompt_len - moved)
        if returned:
            # Back on its own backend: a line saying "moved X -> X" would hide the failure.
            log.warning(
                "request %s: not moved off %s after %d tokens (%s): %s; it continues there (%s)",
                self._ctx.request_id, source.backend.id, tokens, reason, returned, leg.kind,
            )  # fmt: skip
        else:
            log.info(
                "request %s: moved %s -> %s after %d tokens (%s, %s)",
                self._ctx.request_id, source.backend.id, leg.backend.id, tokens, reason, leg.kind,
            )  # fmt: skip
        return "continued"

    def _at_limit(self, ledger: TokenLedger, backend: Backend) -> bool:
        """The stream holds every token its request allowed (a backend that stopped there
        without its finish_reason): it is complete, nothing is left to continue."""
        ctx = self._ctx
        generated = len(ledger.generated)
        if not generated:
            return False
        prompt = ledger.prompt_ids()
        try:
            left = tokens_left(
                ctx.endpoint, ctx.body, len(prompt) if prompt is not None else 0, generated,
                max_model_len=backend.max_model_len if prompt is not None else None,
            )  # fmt: skip
        except ValueError:
            return False
        return left is not None and left <= 0

    async def _resumption(
        self, session: MovingSession, source: Leg, ledger: TokenLedger, order: MoveOrder | None
    ) -> _Resume | str:
        """The continuation of a stream the client received part of; a string says why there
        is none."""
        ctx = self._ctx
        sent = len(ledger.generated)
        ledger.rewind_to_safe()
        prompt_ids = ledger.prompt_ids()
        generated = ledger.generated
        if prompt_ids is None:
            return "the backend returned no prompt token ids"
        try:
            continued = continuation_body(
                ctx.endpoint, ctx.body, prompt_ids, generated,
                max_model_len=source.backend.max_model_len,
            )  # fmt: skip
        except ValueError as e:
            return f"the request cannot continue: {e}"
        resume = _Resume(
            CONTINUE_PATH,
            orjson.dumps(continued),
            len(prompt_ids) + len(generated),
            len(generated),
            sent - len(generated),
            "recompute" if order is None else order.kind,
        )
        if resume.kind == "handover":
            # The source's prefix cache still holds the aborted request's blocks: it computes
            # the last few tokens and offers the KV for the target to pull.
            kv_headers = session.leg_headers()
            kv = await self._legs.kv.kv_from(
                source.backend, resume.path, kv_headers, continued, resume.prompt_len, "handover"
            )
            if kv is not None:
                resume.kv_body = decode_body(continued, kv)
                resume.kv_headers = kv_headers
            else:
                resume.kind = "recompute"
        return resume

    async def _open(
        self,
        session: MovingSession,
        resume: _Resume,
        exclude: set[str],
        required: Backend | None,
        reason: str,
        kind: MoveKind,
        *,
        force: bool = False,
    ) -> tuple[Leg | None, str]:
        """The next leg, on the policy's choice (or `required`, even one not routable now
        with `force`) outside `exclude`, trying another backend after a failed connection;
        None and why when none answered. A handover's KV body goes to a target that
        transfers KV, the plain body to any other; a pre-copy's KV is only on `required`."""
        kv_headers = resume.kv_headers
        detail = "no backend could continue it"
        for _ in range(self._core.settings.max_attempts):
            try:
                if force and required is not None:
                    decision = Decision(target=required, reason=CALLER_CHOSEN)
                else:
                    decision = self._legs.chooser.choose(
                        self._ctx, exclude, first=False, required=required
                    )
            except ProxyError as e:
                return None, e.message
            target = decision.target
            leg_kind = _leg_kind(kind, resume, target, required)
            use_kv = leg_kind == "handover"
            body = resume.kv_body if use_kv and resume.kv_body is not None else resume.body
            headers = kv_headers if use_kv and kv_headers is not None else session.leg_headers()
            kv_headers = None  # a retry elsewhere gets an id of its own
            try:
                # A target pulling the KV computes next to nothing, as a P/D decode leg.
                resp = await session.open_leg(
                    target, resume.path, headers, body, 0 if use_kv else resume.prompt_len
                )
            except RetryableUpstream as e:
                stop = session.note_failure(e, "continuation")
                exclude.add(target.id)
                detail = str(e)
                if stop is not None:
                    return None, stop.message
                if required is not None:
                    return None, detail
                continue
            if resp.status != 200:
                text = await error_detail(resp)
                resp.release()
                session.dispatch.release()
                return None, f"{target.id} answered HTTP {resp.status}: {text}"
            return Leg(decision, None, resp, reason, resume.tokens, leg_kind), ""
        return None, detail

    # --- outcomes

    def leg_started(self, leg: Leg, now: float) -> None:
        """`leg`'s first bytes reached the client (at perf_counter `now`): a move that
        continued on it succeeded."""
        cut_at = self._cut_at
        if cut_at is None:
            return
        self._cut_at = None
        downtime = now - cut_at
        metrics = self._core.metrics
        metrics.migration_downtime.observe(downtime)
        metrics.migration_downtime_by_kind.labels(leg.kind).observe(downtime)
        returned, self._returned = self._returned, ""
        # A move whose target failed is no move: the request is back where it was.
        outcome = "returned" if returned else "ok"
        metrics.count_migration(leg.reason, "failed" if returned else "ok")
        metrics.count_migration_kind(leg.kind, "failed" if returned else "ok")
        detail = f"the target could not continue it ({returned}); it continued on its source"
        self._resolve(
            MoveResult(
                outcome,
                self._cut_from,
                leg.backend.id,
                tokens=leg.tokens_before,
                downtime_s=downtime,
                detail=detail if returned else "",
                kind=leg.kind,
            )
        )

    async def _give_up(self, session: MovingSession, source: Leg, detail: str) -> After:
        self._resolve(MoveResult("failed", source.backend.id, detail=detail))
        log.warning("request %s: %s", self._ctx.request_id, detail)
        message = "the backend failed mid-stream; the response is incomplete"
        if session.stopped is not None:
            message = f"{session.stopped.message}; the response is incomplete"
        elif self._core.settings.error_details:
            message = f"backend {source.backend.id}: {detail}; the response is incomplete"
        await session.end_with_error(message)
        source.backend.last_error = detail
        return "failed"

    def _resolve(self, result: MoveResult) -> None:
        order = self._order
        if order is None:
            return
        self._order = None
        if not order.done.done():
            order.done.set_result(result)

    def _eject(
        self, session: MovingSession, backend: Backend, brk: Break, had_output: bool
    ) -> None:
        """Passive ejection: a backend that broke or stalled under a request gets no new ones
        until its next passing health check (unless the request looks at fault: the session
        judges)."""
        kind: FailureKind = "stalled" if brk.kind == "stalled" else "mid_stream"
        log.warning("request %s: %s %s: %s", self._ctx.request_id, backend.id, kind, brk.detail)
        session.note_break(backend, kind, brk.detail, had_output)


def _leg_kind(
    kind: MoveKind, resume: _Resume, target: Backend, required: Backend | None
) -> MoveKind:
    """How the KV reaches `target`: a handover's only where it can pull it, a pre-copy's only
    on the target it was staged on; else the target computes it."""
    if kind == "handover":
        return "handover" if resume.kv_body is not None and moves_kv(target) else "recompute"
    if kind == "precopy" and target is required:
        return "precopy"
    return "recompute"
