"""The Responses API's routes: `POST /v1/responses`, `GET` and `DELETE
/v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, `GET /v1/responses/{id}/input_items`.

No backend keeps a thread: a request naming `previous_response_id` has its thread loaded from
the proxy's store and expanded into its input before it is routed, so its prompt (the whole
thread) finds the engine that holds the thread's KV cache, and the backend is asked to store
nothing. The answer carries the proxy's own response id. A backend is reached through a
request session (proxy/request/session.py), with its routing and its retries before the first
byte; this module is not on the completions and chat path.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import time
from typing import Any, Protocol

import orjson

from fleet.tokens import estimate_tokens
from policies.policy import RequestContext
from proxy.asgi import Message, Receive, Scope, Send, send_error
from proxy.errors import ProxyError
from proxy.ports import FinishedRequest, FlowControl, FlowTicket, RequestServices
from proxy.request.body import is_stream, parse_object, require_model
from proxy.request.body_reader import BodyReader
from proxy.request.leg_services import LegServices
from proxy.request.responses.answers import HeldAnswer, Identity, StreamStamper
from proxy.request.responses.background import BackgroundRuns
from proxy.request.responses.chain import UNFINISHED, load_chain, not_found
from proxy.request.responses.headers import forwarded_headers, headers_too_large
from proxy.request.responses.input_listing import listed, page_of
from proxy.request.responses.store import ResponseStore, StoredResponse
from proxy.request.responses.thread import expanded_input, input_items, prompt_text
from proxy.request.routes import NOT_YET_SERVED
from proxy.request.session import RequestSession

log = logging.getLogger("fleet_proxy.responses")

PATH = "/v1/responses"
ENDPOINT = "responses"
_ONE = re.compile(r"/v1/responses/([^/]+)")
_CANCEL = re.compile(r"/v1/responses/([^/]+)/cancel")
_INPUT_ITEMS = re.compile(r"/v1/responses/([^/]+)/input_items")
_OTHER_ROUTES = frozenset(p for p, _ in NOT_YET_SERVED)
# Fields for the proxy alone: the backend answers one request and keeps nothing.
_PROXY_FIELDS = ("previous_response_id", "background")


class Authorize(Protocol):
    """The OpenAI endpoints' key check: None to serve the request, or the error to answer."""

    def __call__(self, headers: dict[str, str]) -> ProxyError | None: ...


def serves(path: str) -> bool:
    """Whether `path` is one of this module's routes (vLLM's other routes under it, such as
    `/v1/responses/render`, are not ids)."""
    if path == PATH:
        return True
    if path in _OTHER_ROUTES:
        return False
    return bool(_ONE.fullmatch(path) or _CANCEL.fullmatch(path) or _INPUT_ITEMS.fullmatch(path))


def owner_of(headers: dict[str, str], keyed: bool) -> str:
    """Whose records a request sees: its API key's SHA-256, or "" when keys are off."""
    if not keyed:
        return ""
    _, _, key = headers.get("authorization", "").partition(" ")
    return hashlib.sha256(key.strip().encode("latin-1")).hexdigest()


def new_response_id() -> str:
    return "resp_" + os.urandom(16).hex()


class ResponsesApi:
    def __init__(
        self,
        core: RequestServices,
        legs: LegServices,
        store: ResponseStore,
        bodies: BodyReader,
        authorize: Authorize | None = None,
        flow: FlowControl | None = None,
    ) -> None:
        self._core = core
        self._flow = flow  # flow control, when configured: responses queue as chat does
        self._legs = legs
        self.store = store
        self._bodies = bodies  # the process's, shared with the completions and chat path
        self._authorize = authorize
        self._runs = BackgroundRuns()
        self._aliases = dict(core.settings.model_aliases)
        self._drop_credentials = not core.settings.forward_client_authorization
        self._max_header_bytes = core.settings.max_forwarded_header_bytes

    async def close(self) -> None:
        """Stop the background responses this process runs, then the store."""
        await self._runs.close()
        await self.store.close()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        served = _Served(headers.get("x-request-id") or os.urandom(16).hex())
        request_id = served.request_id
        status = 500
        try:
            try:
                if self._authorize is not None:
                    refusal = self._authorize(headers)
                    if refusal is not None:
                        raise refusal
                owner = owner_of(headers, self._authorize is not None)
                path, method = scope["path"], scope["method"]
                if path == PATH:
                    _allow(method, "POST")
                    status = await self._create(scope, receive, send, headers, owner, served)
                    return
                cancel = _CANCEL.fullmatch(path)
                items = _INPUT_ITEMS.fullmatch(path)
                if cancel is not None:
                    _allow(method, "POST")
                    answer = await self._cancel(cancel.group(1), owner)
                elif items is not None:
                    _allow(method, "GET")
                    answer = await self._input_items(items.group(1), owner, scope)
                else:
                    rid = path[len(PATH) + 1 :]
                    _allow(method, "GET", "DELETE")
                    answer = await (self._get if method == "GET" else self._delete)(rid, owner)
                status = 200
                await _send_json(send, 200, answer, request_id)
            except ProxyError as e:
                status = e.status
                await send_error(send, e, request_id)
            except Exception:
                log.exception("request %s failed inside the proxy", request_id)
                status = 500
                await send_error(
                    send, ProxyError(500, "internal proxy error", type="internal_error"), request_id
                )
        finally:
            self._core.metrics.count_request(ENDPOINT, status, served.model)
            if not served.background:  # a background run ends its own request
                served.status = status
                self._end(served)

    def _end(self, served: _Served) -> None:
        """Give the request's body bytes back to the budget, and write its line in the
        request log."""
        self._bodies.budget.release(served.held)
        served.held = 0
        ticket, served.ticket = served.ticket, None
        if ticket is not None:
            assert self._flow is not None
            self._flow.done(ticket, served.finished())
        request_log = self._core.request_log
        if request_log is not None and request_log.sampled():
            finished = served.finished()
            request_log.record(
                ENDPOINT, served.request_id, served.status, served.arrived, finished, ticket
            )

    # --- stored responses

    async def _get(self, response_id: str, owner: str) -> dict[str, Any]:
        record = await self.store.get(response_id, owner)
        if record is None:
            raise not_found(response_id)
        return record.response

    async def _input_items(self, response_id: str, owner: str, scope: Scope) -> dict[str, Any]:
        page = page_of(scope.get("query_string", b""))
        record = await self.store.get(response_id, owner)
        if record is None:
            raise not_found(response_id)
        return listed(record.id, record.input_items, page)

    async def _delete(self, response_id: str, owner: str) -> dict[str, Any]:
        if not await self.store.delete(response_id, owner):
            raise not_found(response_id)
        self._runs.cancel(response_id)
        return {"id": response_id, "object": "response.deleted", "deleted": True}

    async def _cancel(self, response_id: str, owner: str) -> dict[str, Any]:
        record = await self.store.get(response_id, owner)
        if record is None:
            raise not_found(response_id)
        if record.response.get("background") is not True:
            raise ProxyError(400, "Cannot cancel a synchronous response.", param="response_id")
        if record.status not in UNFINISHED:
            return record.response  # finished already: cancelling changes nothing
        # A response running on another replica sees the mark before it stores its answer.
        self._runs.cancel(response_id)
        cancelled = {**record.response, "status": "cancelled"}
        await self.store.put(_replaced(record, cancelled))
        return cancelled

    # --- new responses

    async def _create(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        headers: dict[str, str],
        owner: str,
        served: _Served,
    ) -> int:
        request_id = served.request_id
        upstream, size = forwarded_headers(scope["headers"], self._drop_credentials, request_id)
        if size > self._max_header_bytes:
            raise headers_too_large(size, self._max_header_bytes)
        raw_body = await self._bodies.read(receive, headers.get("content-length"))
        served.held = len(raw_body)
        body = parse_object(raw_body)
        model = require_model(body)
        model = self._aliases.get(model, model)
        served.model = model
        stream = is_stream(body)
        store = body.get("store") is not False  # stored unless the client says not to
        background = body.get("background") is True
        if background and not store:
            raise ProxyError(400, "background can only be used when `store` is true", param="store")
        if background and stream:
            raise ProxyError(
                400, "fleet-proxy does not stream a background response", param="stream"
            )
        previous = body.get("previous_response_id")
        if previous is not None and not isinstance(previous, str):
            raise ProxyError(
                400, "'previous_response_id' must be a string", param="previous_response_id"
            )
        items = input_items(body)
        chain = await load_chain(self.store, previous, owner) if previous is not None else []
        expanded = expanded_input(chain, items)
        upstream_body = {k: v for k, v in body.items() if k not in _PROXY_FIELDS}
        upstream_body.update(model=model, input=expanded, store=False)
        identity = Identity(new_response_id(), previous, store, background)
        ctx = self._context(upstream_body, headers, request_id, stream and not background)
        raw = orjson.dumps(upstream_body)
        turn = _Turn(self.store, identity, owner, items)
        if background:
            queued = identity.stamp(_queued(upstream_body, model))
            await turn.keep(queued)
            run = self._in_background(ctx, raw, upstream, turn, queued, served)
            # From here the run holds the body and writes the request's log line when it ends
            # (or is cancelled, started or not).
            served.background = True
            served.status = 499  # unless the run ends with a status of its own
            self._runs.start(identity.id, run).add_done_callback(lambda _: self._end(served))
            await _send_json(send, 200, queued, ctx.request_id)
            return 200
        if stream:
            stamper = StreamStamper(send, identity, turn.keep if store else None)
            return await self._run_watched(receive, ctx, raw, upstream, stamper, served)
        held = HeldAnswer(self._core.settings.max_held_answer_bytes)
        status = await self._run_watched(receive, ctx, raw, upstream, held, served)
        answer = held.body
        if held.status == 200:
            response = identity.stamp(orjson.loads(answer))
            if store:
                await turn.keep(response)
            answer = orjson.dumps(response)
        out = [(k, v) for k, v in held.headers if k not in (b"content-length", b"content-type")]
        out += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(answer))]
        await send({"type": "http.response.start", "status": held.status, "headers": out})
        await send({"type": "http.response.body", "body": answer})
        return status

    def _context(
        self, body: dict[str, Any], headers: dict[str, str], request_id: str, stream: bool
    ) -> RequestContext:
        settings = self._core.settings
        text = prompt_text(body.get("instructions"), body["input"])
        session_id = headers.get(settings.session_header) if settings.session_header else None
        if session_id is None and settings.session_body_field:
            value = body.get(settings.session_body_field)
            session_id = value if isinstance(value, str) else None
        return RequestContext(
            request_id=request_id,
            endpoint=ENDPOINT,
            model=body["model"],
            body=body,
            headers=headers,
            stream=stream,
            prompt_text=text,
            prompt_tokens=estimate_tokens(text, settings.chars_per_token),
            session_id=session_id,
            program_id=headers.get("x-program-id") or session_id,
        )

    async def _run(
        self,
        ctx: RequestContext,
        body: bytes,
        upstream: list[tuple[bytes, bytes]],
        send: Send,
        served: _Served,
    ) -> int:
        if self._flow is not None:
            # Last before routing, as for chat. A client leaving while its request is queued
            # cancels this task (its watcher), which takes it out of the queue.
            served.ticket = await self._flow.admit(ctx, _no_disconnect)
        session = RequestSession(
            self._core, self._legs, PATH, ctx, body, upstream, send, served.arrived, None
        )
        if served.ticket is not None:
            session.let_through(served.ticket)
        served.session = session
        return await session.run()

    async def _run_watched(
        self,
        receive: Receive,
        ctx: RequestContext,
        body: bytes,
        upstream: list[tuple[bytes, bytes]],
        send: Send,
        served: _Served,
    ) -> int:
        """`_run`, cancelled when its client goes away (closing the upstream request makes
        the engine abort it)."""
        task = asyncio.current_task()
        assert task is not None
        watch = _Watch()

        async def sending(message: Message) -> None:
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body"):
                watch.answered = True  # the server reports its connection done from now on

        watcher = asyncio.create_task(_watch_disconnect(receive, task, watch))
        try:
            return await self._run(ctx, body, upstream, sending, served)
        except asyncio.CancelledError:
            if not watch.gone:
                raise
            task.uncancel()
            return 499
        finally:
            watch.answered = True
            watcher.cancel()

    async def _in_background(
        self,
        ctx: RequestContext,
        body: bytes,
        upstream: list[tuple[bytes, bytes]],
        turn: _Turn,
        queued: dict[str, Any],
        served: _Served,
    ) -> None:
        await turn.keep({**queued, "status": "in_progress"})
        held = HeldAnswer(self._core.settings.max_held_answer_bytes)
        run = asyncio.ensure_future(self._run(ctx, body, upstream, held, served))
        elsewhere = asyncio.ensure_future(_cancelled_in_store(turn))
        try:
            await asyncio.wait((run, elsewhere), return_when=asyncio.FIRST_COMPLETED)
            if not run.done():
                # Cancelled (or deleted) through another replica or worker: stop the engine's
                # request here, where it runs; the store already says so.
                run.cancel()
                await asyncio.wait((run,))
                served.status = 499
                return
            served.status = run.result()
            answer = orjson.loads(held.body) if held.body else {}
            if held.status == 200 and isinstance(answer, dict):
                final = turn.identity.stamp(answer)
            else:
                error = answer.get("error") if isinstance(answer, dict) else None
                final = _failed(queued, held.status, error)
        except ProxyError as e:
            served.status = e.status
            final = _failed(queued, e.status, {"message": e.message, "code": e.code})
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("background response %s failed inside the proxy", turn.identity.id)
            served.status = 500
            final = _failed(queued, 500, {"message": "internal proxy error", "code": 500})
        finally:
            elsewhere.cancel()
            run.cancel()  # when this task itself was cancelled (a cancel in this process)
        now = await turn.store.get(turn.identity.id, turn.owner)
        if now is None or now.status == "cancelled":
            return  # deleted or cancelled meanwhile, maybe by another replica
        await turn.keep(final)


# How often a background response's run looks in the store for a cancel sent to another
# replica or worker (a cancel sent to this process stops it at once).
CANCEL_POLL_S = 1.0


async def _cancelled_in_store(turn: _Turn) -> None:
    """Returns once the response is cancelled or deleted in the store, by whichever replica."""
    while True:
        await asyncio.sleep(CANCEL_POLL_S)
        now = await turn.store.get(turn.identity.id, turn.owner)
        if now is None or now.status == "cancelled":
            return


async def _no_disconnect() -> Message:
    """A `receive` that never reports anything: disconnects are watched elsewhere."""
    never: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
    return await never


class _Served:
    """One request as its end needs it: its body bytes held in the budget, and what its line
    in the request log says."""

    __slots__ = (
        "arrived", "background", "held", "model", "request_id", "session", "status", "ticket",
    )  # fmt: skip

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.arrived = time.perf_counter()
        self.status = 500
        self.model: str | None = None
        self.held = 0
        self.session: RequestSession | None = None  # the one that generated the response
        self.background = False
        self.ticket: FlowTicket | None = None  # flow control's, once it let the request through

    def finished(self) -> FinishedRequest | None:
        return self.session.finished() if self.session is not None else None


class _Turn:
    """One new response of a thread, as the store keeps it."""

    __slots__ = ("created_at", "identity", "items", "owner", "store")

    def __init__(
        self, store: ResponseStore, identity: Identity, owner: str, items: list[dict[str, Any]]
    ) -> None:
        self.store = store
        self.identity = identity
        self.owner = owner
        self.items = items
        self.created_at = time.time()

    async def keep(self, response: dict[str, Any]) -> None:
        ident = self.identity
        await self.store.put(
            StoredResponse(ident.id, self.owner, self.created_at, ident.previous_id, self.items,
                           response)
        )  # fmt: skip


def _replaced(record: StoredResponse, response: dict[str, Any]) -> StoredResponse:
    return StoredResponse(
        record.id, record.owner, record.created_at, record.previous_id, record.input_items,
        response,
    )  # fmt: skip


def _queued(body: dict[str, Any], model: str) -> dict[str, Any]:
    """The response object of a background request not started yet."""
    return {
        "object": "response",
        "created_at": int(time.time()),
        "status": "queued",
        "model": model,
        "output": [],
        "usage": None,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata"),
        "max_output_tokens": body.get("max_output_tokens"),
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
    }


def _failed(queued: dict[str, Any], status: int, error: Any) -> dict[str, Any]:
    detail = error if isinstance(error, dict) else {}
    message = detail.get("message") or f"the backend answered {status}"
    code = detail.get("code") or status
    return {**queued, "status": "failed", "error": {"code": str(code), "message": message}}


def _allow(method: str, *methods: str) -> None:
    if method not in methods:
        allowed = ", ".join(methods)
        raise ProxyError(
            405, f"this path takes {allowed}", code=405, headers=[(b"allow", allowed.encode())]
        )


async def _send_json(send: Send, status: int, answer: dict[str, Any], request_id: str) -> None:
    body = orjson.dumps(answer)
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"x-request-id", request_id.encode("latin-1")),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Watch:
    __slots__ = ("answered", "gone")

    def __init__(self) -> None:
        self.answered = False  # the whole answer went out
        self.gone = False  # the client left before


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], watch: _Watch) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    if not watch.answered:
        watch.gone = True
        task.cancel()
