"""The hot path: a raw ASGI handler for the OpenAI endpoints, forwarding with proxy/upstream.

Why not a FastAPI route with httpx: measured here (REFERENCE §7) that costs ~14x the CPU per
request. This handler parses the body once, never looks inside a stream chunk beyond counting
its SSE events, and relays every chunk the moment it arrives.

Failure rules:
- before the first byte reaches the client (connect error, timeout, a 5xx answer, a connection
  dropped while reading a non-streamed answer) the request is retried on another backend, or
  on a still-healthy one again when none is left, bounded by `max_attempts` (tenacity);
- after it, the stream ends with an OpenAI-style error event: the client never sees output twice;
- a client that goes away cancels the upstream request (watched from 50 ms into a request, so
  within 50 ms at worst), and closing that connection makes vLLM abort it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from fleet.types import Backend
from policies.base import Decision, NoCandidate, RequestContext
from proxy.accounting import Dispatch
from proxy.core import ProxyCore
from proxy.disagg import PREFILLER_HEADER, PrefillFailed, decode_body, host_port, run_prefill_leg
from proxy.errors import ProxyError, sse_error_event
from proxy.live import LiveRequest
from proxy.openai_request import (
    chat_prompt,
    completion_prompt,
    is_stream,
    parse_object,
    require_model,
)
from proxy.upstream import UpstreamError, UpstreamPool, UpstreamResponse, split_url

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

log = logging.getLogger("fleet_proxy.forward")

# Request headers that describe this hop only, or that the proxy itself consumes.
_DROP_REQUEST_HEADERS = frozenset(
    {
        b"host",
        b"content-length",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"trailer",
        b"upgrade",
        b"proxy-authorization",
        b"proxy-connection",
        b"x-request-id",
        b"x-fleet-debug",
    }
)
_DROP_RESPONSE_HEADERS = frozenset(
    {
        b"content-length",
        b"transfer-encoding",
        b"connection",
        b"keep-alive",
        b"date",
        b"server",
        b"x-request-id",
    }
)
# A request still running after this long starts watching for its client leaving.
WATCH_AFTER_S = 0.05

# Answers that say "this backend, now" rather than "this request": safe to try elsewhere.
RETRYABLE_STATUS = frozenset({500, 502, 503, 504})

# Paths served by this handler: (endpoint name, generates tokens)
HOT_ROUTES: dict[str, tuple[str, bool]] = {
    "/v1/completions": ("completions", True),
    "/v1/chat/completions": ("chat/completions", True),
    "/v1/embeddings": ("embeddings", False),
    "/tokenize": ("tokenize", False),
    "/detokenize": ("detokenize", False),
}


_GENERATION = frozenset({"completions", "chat/completions"})


class RetryableUpstream(Exception):
    """A backend failed before anything reached the client."""

    def __init__(self, backend: Backend, kind: str, detail: str) -> None:
        super().__init__(f"{backend.id}: {detail}")
        self.backend = backend
        self.kind = kind


class _Watch:
    """Shared between a request and its disconnect watcher."""

    __slots__ = ("disconnected", "finished")

    def __init__(self) -> None:
        self.disconnected = False
        self.finished = False


class Forwarder:
    def __init__(self, core: ProxyCore) -> None:
        self.core = core
        self.settings = core.settings
        self._on_finish = getattr(core.policy, "on_finish", None)
        self._chars_per_token = core.settings.chars_per_token
        self._watchers: set[asyncio.Task[None]] = set()
        self._splits: dict[str, tuple[str, str]] = {}  # backend URL -> (origin, path prefix)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint, generates = HOT_ROUTES[scope["path"]]
        arrived = time.perf_counter()
        # One pass over the headers: all of them for routing, the end-to-end ones for upstream.
        headers: dict[str, str] = {}
        upstream: list[tuple[bytes, bytes]] = []  # sent as the client sent them
        for k, v in scope["headers"]:
            headers[k.decode("latin-1")] = v.decode("latin-1")
            if k not in _DROP_REQUEST_HEADERS:
                upstream.append((k, v))
        request_id = headers.get("x-request-id") or os.urandom(16).hex()
        # The same id on every leg lets vLLM's abort and logs line up with ours.
        upstream.append((b"x-request-id", request_id.encode("latin-1")))
        status = 500
        try:
            body = await self._read_body(receive, headers)
            ctx = self._context(endpoint, generates, body, headers, request_id)
            tokens = self.core.tokens
            if tokens is not None and tokens.mode != "estimate" and not ctx.prompt_is_token_ids:
                ctx.prompt_tokens = await tokens.count(ctx.prompt_text, ctx.model)
            status = await self._serve(scope, receive, send, ctx, body, upstream, arrived)
        except ProxyError as e:
            status = e.status
            await send_error(send, e, request_id)
        except Exception:
            # Never a traceback to the client; the log keeps it.
            log.exception("request %s failed inside the proxy", request_id)
            await send_error(
                send,
                ProxyError(500, "internal proxy error", type="internal_error"),
                request_id,
            )
        self.core.metrics.count_request(endpoint, status)

    async def _read_body(self, receive: Receive, headers: dict[str, str]) -> bytes:
        limit = self.settings.max_body_bytes
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise ProxyError(413, f"request body over the {limit}-byte limit", code=413)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ProxyError(499, "client disconnected while sending the body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ProxyError(413, f"request body over the {limit}-byte limit", code=413)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _context(
        self,
        endpoint: str,
        generates: bool,
        body: bytes,
        headers: dict[str, str],
        request_id: str,
    ) -> RequestContext:
        parsed = parse_object(body)
        model = require_model(parsed)
        token_count: int | None = None
        if endpoint == "completions":
            text, token_count = completion_prompt(parsed)
        elif endpoint == "chat/completions":
            text = chat_prompt(parsed)
        else:
            text = ""
        stream = is_stream(parsed) if generates else False
        tokens = token_count if token_count is not None else int(len(text) / self._chars_per_token)
        session_id = headers.get("x-session-id")
        if session_id is None:
            user = parsed.get("user")
            session_id = user if isinstance(user, str) else None
        return RequestContext(
            request_id=request_id,
            endpoint=endpoint,
            model=model,
            body=parsed,
            headers=headers,
            stream=stream,
            prompt_text=text,
            prompt_tokens=tokens,
            session_id=session_id,
            program_id=headers.get("x-program-id") or session_id,
            debug=headers.get("x-fleet-debug") == "1",
            prompt_is_token_ids=token_count is not None,
        )

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        ctx: RequestContext,
        raw_body: bytes,
        upstream_headers: list[tuple[bytes, bytes]],
        arrived: float,
    ) -> int:
        watch = _Watch()
        task = asyncio.current_task()
        assert task is not None
        # Most answers are done before this: they never get a watcher task (one per request
        # was ~5% of the proxy's CPU). A client that leaves sooner is still noticed at once
        # when the watcher starts, since uvicorn keeps the disconnect for receive().
        start_watching = asyncio.get_running_loop().call_later(
            WATCH_AFTER_S, self._start_watcher, receive, task, watch
        )
        ex = _Exchange(scope["path"], ctx, raw_body, upstream_headers, send, arrived)
        try:
            try:
                return await self._attempt(ex)
            except RetryableUpstream as first:
                self._note_failure(ex, first)
                return await self._retry(ex, first)
        except asyncio.CancelledError:
            if not watch.disconnected:
                raise
            # The client left: the upstream request was closed by the cancellation.
            task.uncancel()
            self.core.metrics.client_disconnects.inc()
            return 499
        finally:
            watch.finished = True
            start_watching.cancel()

    def _start_watcher(self, receive: Receive, task: asyncio.Task[Any], watch: _Watch) -> None:
        if watch.finished:
            return
        # Not cancelled on the way out: uvicorn answers the watcher's receive() with
        # http.disconnect once the response is complete, and the watcher then just returns.
        watcher = asyncio.create_task(_watch_disconnect(receive, task, watch))
        self._watchers.add(watcher)  # the loop keeps only weak references to tasks
        watcher.add_done_callback(self._watchers.discard)

    async def _retry(self, ex: _Exchange, first: RetryableUpstream) -> int:
        last: RetryableUpstream = first
        if self.settings.max_attempts <= 1:
            raise _exhausted(ex.tried, last)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(self.settings.max_attempts - 1),
            retry=retry_if_exception_type(RetryableUpstream),
            wait=wait_random_exponential(multiplier=0.01, max=0.2),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    self.core.metrics.retries.labels(last.kind).inc()
                    try:
                        return await self._attempt(ex)
                    except RetryableUpstream as e:
                        self._note_failure(ex, e)
                        last = e
                        raise
        except RetryableUpstream:
            pass
        except ProxyError as e:
            if e.status != 503:
                raise
        raise _exhausted(ex.tried, last)

    def _note_failure(self, ex: _Exchange, e: RetryableUpstream) -> None:
        self.core.metrics.upstream_errors.labels(e.backend.id, e.kind).inc()
        log.warning(
            "request %s: attempt %d on %s failed after %.2fs (%s): %s",
            ex.ctx.request_id, len(ex.tried), e.backend.id,
            time.perf_counter() - ex.arrived, e.kind, e,
        )  # fmt: skip
        e.backend.last_error = str(e)
        if e.kind == "connect":
            # Passive health: stop sending here until the next health check says otherwise.
            e.backend.healthy = False

    def _choose(self, ctx: RequestContext, tried: list[str]) -> Decision:
        core = self.core
        now = core.clock.now()
        candidates = core.fleet.candidates(ctx.model, now)
        if tried:
            # Another backend first; when every one was tried, a healthy one again (after the
            # retry's backoff): a lone backend that timed out once deserves a second chance.
            untried = [b for b in candidates if b.id not in tried]
            candidates = untried or candidates
        if not candidates:
            if not tried and core.fleet.routable(now) and not core.fleet.knows_model(ctx.model):
                raise ProxyError(
                    404,
                    f"The model `{ctx.model}` does not exist.",
                    type="not_found_error",
                    param="model",
                    code="model_not_found",
                )
            raise _unavailable(f"no healthy backend serves model `{ctx.model}` right now")
        try:
            return core.policy.pick(ctx, candidates, now)
        except NoCandidate as e:
            raise _unavailable(str(e)) from None

    def _target(self, backend: Backend, path: str) -> tuple[str, str]:
        """The origin and full path of `path` on `backend` (its URL may carry a prefix)."""
        split = self._splits.get(backend.url)
        if split is None:
            split = self._splits[backend.url] = split_url(backend.url)
        origin, prefix = split
        return origin, prefix + path

    async def _prefill_elsewhere(
        self, ex: _Exchange, decision: Decision, pool: UpstreamPool
    ) -> tuple[Backend | None, bytes, list[tuple[bytes, bytes]], int | None]:
        """Carry out the prefill leg of a disaggregated decision.

        Returns the prefill backend used (None: prefill on the target), the body and headers
        for the target, and the prompt tokens to charge there (None: unchanged)."""
        prefill = decision.prefill
        ctx = ex.ctx
        if prefill is None or ctx.endpoint not in _GENERATION:
            return None, ex.body, ex.headers, None
        if self.settings.pd_mode == "header":
            hint = (PREFILLER_HEADER, host_port(prefill).encode("latin-1"))
            return prefill, ex.body, [*ex.headers, hint], None
        leg_tokens = decision.prefill_leg_tokens
        origin, path = self._target(prefill, ex.path)
        try:
            kv = await run_prefill_leg(
                pool, prefill, origin, path, ctx.body, ex.headers,
                ctx.prompt_tokens if leg_tokens is None else leg_tokens,
                self.settings.pd_prefill_timeout,
            )  # fmt: skip
        except PrefillFailed as e:
            # Fall back to prefilling on the decode backend: slower, never lost.
            self.core.metrics.pd_prefill_legs.labels(e.reason).inc()
            log.warning("request %s: prefill leg failed (%s)", ctx.request_id, e)
            return None, ex.body, ex.headers, None
        self.core.metrics.pd_prefill_legs.labels("ok").inc()
        # The decode backend pulls the KV instead of computing it.
        return prefill, decode_body(ctx.body, kv), ex.headers, 0

    async def _attempt(self, ex: _Exchange) -> int:
        ctx = ex.ctx
        decision = self._choose(ctx, ex.tried)
        backend = decision.target
        ex.tried.append(backend.id)
        core = self.core
        pool = core.upstream
        assert pool is not None
        prefill, body, headers, charge = await self._prefill_elsewhere(ex, decision, pool)
        if charge is None:
            # What the policy expects the backend to compute (its uncached part), else all.
            charge = decision.prefill_tokens
            if charge is None:
                charge = ctx.prompt_tokens
        dispatch = Dispatch(backend.load, charge)
        live = LiveRequest(
            request_id=ctx.request_id,
            endpoint=ctx.endpoint,
            model=ctx.model,
            body=ctx.body,
            stream=ctx.stream,
            prompt_tokens=charge,
            backend_id=backend.id,
            started_at=ex.arrived,
            dispatched_at=time.perf_counter(),
            attempts=len(ex.tried),
        )
        core.live.add(live)
        sent_start = False
        origin, path = self._target(backend, ex.path)
        try:
            async with await pool.request(origin, path, headers, body) as resp:
                status = resp.status
                if status in RETRYABLE_STATUS:
                    detail = (await resp.read())[:300].decode("utf-8", "replace")
                    raise RetryableUpstream(backend, "status", f"HTTP {status}: {detail}")
                out_headers = _response_headers(resp.raw_headers, ctx.request_id, backend.id)
                if prefill is not None:
                    out_headers.append((b"x-fleet-prefill", prefill.id.encode("latin-1")))
                if ctx.debug:
                    out_headers.append((b"x-fleet-decision", _receipt(decision)))
                if not ctx.stream or status != 200:
                    data = await resp.read()
                    dispatch.prefilled()
                    out_headers.append((b"content-length", b"%d" % len(data)))
                    sent_start = True
                    await ex.send(
                        {"type": "http.response.start", "status": status, "headers": out_headers}
                    )
                    await ex.send({"type": "http.response.body", "body": data})
                else:
                    sent_start = True
                    await ex.send(
                        {"type": "http.response.start", "status": status, "headers": out_headers}
                    )
                    await self._relay_stream(ex, resp, backend, dispatch, live)
                self._observe(ctx.endpoint, ex.arrived)
                return status
        except UpstreamError as e:
            if sent_start:
                raise
            raise RetryableUpstream(backend, _failure_kind(e), str(e)) from None
        finally:
            dispatch.release()
            core.live.remove(live)
            if self._on_finish is not None:
                self._on_finish(ctx, decision)

    async def _relay_stream(
        self,
        ex: _Exchange,
        resp: UpstreamResponse,
        backend: Backend,
        dispatch: Dispatch,
        live: LiveRequest,
    ) -> None:
        """Every chunk to the client as it arrives; a break ends with an error event."""
        send = ex.send
        try:
            async for chunk in resp:
                if not dispatch.decoding:
                    dispatch.first_token()
                    live.first_token_at = time.perf_counter()
                    self.core.metrics.observe_ttft(
                        ex.ctx.endpoint, live.first_token_at - ex.arrived
                    )
                live.events += chunk.count(b"data: ")
                if resp.at_end:
                    # The last bytes and the end of the response in one write.
                    await send({"type": "http.response.body", "body": chunk})
                    return
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except UpstreamError as e:
            self.core.metrics.upstream_errors.labels(backend.id, "mid_stream").inc()
            backend.last_error = f"stream broke: {e}"
            log.warning("request %s: %s mid-stream: %s", ex.ctx.request_id, backend.id, e)
            message = (
                f"backend {backend.id} failed mid-stream ({e.kind}); the response is incomplete"
            )
            await send(
                {"type": "http.response.body", "body": sse_error_event(message), "more_body": True}
            )
        await send({"type": "http.response.body", "body": b""})

    def _observe(self, endpoint: str, arrived: float) -> None:
        self.core.metrics.observe_duration(endpoint, time.perf_counter() - arrived)


class _Exchange:
    """One client request across its attempts: what every attempt needs, in one place."""

    __slots__ = ("arrived", "body", "ctx", "headers", "path", "send", "tried")

    def __init__(
        self,
        path: str,
        ctx: RequestContext,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        send: Send,
        arrived: float,
    ) -> None:
        self.path = path
        self.ctx = ctx
        self.body = body  # the client's bytes, forwarded as they came
        self.headers = headers  # end-to-end headers for the backend
        self.send = send
        self.arrived = arrived
        self.tried: list[str] = []  # backend ids, in attempt order


def _unavailable(message: str) -> ProxyError:
    return ProxyError(
        503, message, type="service_unavailable", code=503, headers=[(b"retry-after", b"1")]
    )


def _exhausted(tried: list[str], last: RetryableUpstream) -> ProxyError:
    return ProxyError(
        502,
        f"no backend answered after {len(tried)} attempt(s) ({', '.join(tried)}); "
        f"last error: {last}",
        type="upstream_error",
        code=502,
    )


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], watch: _Watch) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not watch.finished:
        watch.disconnected = True
        task.cancel()


def _failure_kind(e: UpstreamError) -> str:
    """Metric and health label: only a refused connection says the backend is down."""
    if e.kind == "connect":
        return "connect_timeout" if e.timed_out else "connect"
    return "io"


def _response_headers(
    raw: list[tuple[bytes, bytes]], request_id: str, backend_id: str
) -> list[tuple[bytes, bytes]]:
    out = [(k.lower(), v) for k, v in raw if k.lower() not in _DROP_RESPONSE_HEADERS]
    out.append((b"x-request-id", request_id.encode("latin-1")))
    out.append((b"x-fleet-backend", backend_id.encode("latin-1")))
    return out


def _receipt(decision: Decision) -> bytes:
    return orjson.dumps(
        {
            "backend": decision.target.id,
            "prefill": decision.prefill.id if decision.prefill else None,
            "reason": decision.reason,
            "scores": decision.scores,
        }
    )


async def send_error(send: Send, error: ProxyError, request_id: str) -> None:
    body = error.body()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        *([(b"x-request-id", request_id.encode("latin-1"))] if request_id else []),
        *error.headers,
    ]
    try:
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    except (OSError, RuntimeError):
        pass  # the client is gone; nothing to tell it
