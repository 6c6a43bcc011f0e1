"""The audio routes (`/v1/audio/transcriptions`, `/v1/audio/translations`): multipart uploads
of many megabytes, relayed to a backend serving the form's `model` in bounded memory.

The body is read until its `model` field is found (proxy/request/form_peek.py), holding only
those bytes; then a backend is chosen as for any request (the configured policy, with no
prompt text to score) and the body streams on to it as the client sends it. A body of at
most `audio_replay_bytes` is held whole instead, so that a backend failing before its answer
can be replaced by another (up to `max_attempts`); a larger one is tried on one backend only,
unless it failed before any of the body was sent (no connection). The answer is relayed as it
comes: JSON, text, or an event stream (`stream=true`).

A cold path by design: an httpx client per request (the lean upstream client sends whole
bodies only), nothing of it shared with the generation routes.
"""

from __future__ import annotations

import logging
import os
import time

import httpx

from policies.policy import RequestContext
from proxy.asgi import Receive, Scope, Send, response_headers, send_error
from proxy.backends.accounting import Dispatch
from proxy.errors import FailureKind, ProxyError
from proxy.ports import FinishedRequest, RequestServices
from proxy.request.body_reader import BodyReader
from proxy.request.choosing import BackendChooser
from proxy.request.entry import Authorize, _without_connection_named
from proxy.request.form_peek import FieldPeek, form_boundary
from proxy.request.routes import AUDIO_ROUTES
from proxy.request.upload import BodyCut, Upload
from proxy.request.upstream_failures import RETRYABLE_STATUS

log = logging.getLogger("fleet_proxy.audio")

# Request headers that describe this hop only, or that the proxy consumes or sets itself.
_DROP = frozenset(
    {
        b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding", b"te",
        b"trailer", b"upgrade", b"proxy-authorization", b"proxy-connection", b"x-request-id",
        b"x-fleet-debug", b"expect",
    }
)  # fmt: skip
_WANTED = frozenset({"model"})


class AudioRelay:
    """The raw ASGI handler of the audio routes; `bodies` reads into the process's body budget,
    shared with the generation routes."""

    def __init__(
        self,
        core: RequestServices,
        bodies: BodyReader,
        authorize: Authorize | None = None,
    ) -> None:
        self.core = core
        self._bodies = bodies
        self._authorize = authorize
        self._chooser = BackendChooser(core)
        s = core.settings
        self._drop = _DROP if s.forward_client_authorization else _DROP | {b"authorization"}
        key = s.backend_api_key
        self._backend_auth = None if key is None else f"Bearer {key.get_secret_value()}"
        self._timeout = httpx.Timeout(
            s.read_timeout, connect=s.connect_timeout, pool=s.connect_timeout
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = AUDIO_ROUTES[scope["path"]]
        arrived = time.perf_counter()
        headers: dict[str, str] = {}
        upstream: list[tuple[bytes, bytes]] = []
        for k, v in scope["headers"]:
            headers[k.decode("latin-1")] = v.decode("latin-1")
            if k not in self._drop:
                upstream.append((k, v))
        named = headers.get("connection")
        if named is not None:
            upstream = _without_connection_named(upstream, named)
        request_id = headers.get("x-request-id") or os.urandom(16).hex()
        limit = self.core.settings.max_body_bytes
        upload = Upload(receive, limit, self._bodies.budget, self._bodies.no_room)
        status = 500
        model: str | None = None
        tried: list[str] = []  # the backends asked, in order
        answered = False  # by the last one tried
        try:
            if self._authorize is not None:
                refusal = self._authorize(headers)
                if refusal is not None:
                    raise refusal
            declared = headers.get("content-length")
            if declared is not None and declared.isdigit():
                if int(declared) > limit:
                    raise ProxyError(413, f"request body over the {limit}-byte limit", code=413)
                upstream.append((b"content-length", declared.encode()))
            # Last: each attempt's own id is made from it (_backend_headers).
            upstream_id = f"{request_id}-{os.urandom(6).hex()}"
            upstream.append((b"x-request-id", upstream_id.encode("latin-1")))
            model = await self._read_model(upload, headers.get("content-type"))
            ctx = RequestContext(
                request_id=request_id, endpoint=endpoint, model=model, body={"model": model},
                headers=headers, stream=False, prompt_text="", prompt_tokens=0,
            )  # fmt: skip
            status = await self._relay(ctx, scope["path"], upload, upstream, send, tried)
            answered = True
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
            upload.release()
        metrics = self.core.metrics
        metrics.count_request(endpoint, status, model)
        if model is not None:
            metrics.observe_duration(endpoint, model, time.perf_counter() - arrived)
        request_log = self.core.request_log
        if request_log is not None and request_log.sampled():
            finished = None if model is None else _finished(model, tried, answered)
            request_log.record(endpoint, request_id, status, arrived, finished)

    async def _read_model(self, upload: Upload, content_type: str | None) -> str:
        """Read (and hold) the body until its `model` field, or whole when it is small enough
        to send again; 400 when the body has no `model`."""
        peek = FieldPeek(form_boundary(content_type), _WANTED)
        while not peek.done and not upload.ended:
            peek.feed(await upload.keep_next())
        replay = self.core.settings.audio_replay_bytes
        while not upload.ended and upload.size <= replay:
            await upload.keep_next()
        model = peek.values.get("model")
        if not model:
            raise ProxyError(400, "you must provide a model parameter", param="model")
        return model

    async def _relay(
        self,
        ctx: RequestContext,
        path: str,
        upload: Upload,
        headers: list[tuple[bytes, bytes]],
        send: Send,
        tried: list[str],
    ) -> int:
        replayable = upload.ended
        settings = self.core.settings
        dispatch = Dispatch(None, 0)
        last = ""
        async with httpx.AsyncClient(timeout=self._timeout) as client:
            try:
                for attempt in range(settings.max_attempts):
                    backend = self._chooser.choose(ctx, tried, first=True).target
                    tried.append(backend.id)
                    dispatch.move(backend.load, 0)
                    sending = upload.whole() if replayable else upload.rest()
                    request = client.build_request(
                        "POST", backend.url + path,
                        headers=self._backend_headers(headers, attempt), content=sending,
                    )  # fmt: skip
                    try:
                        resp = await client.send(request, stream=True)
                    except BodyCut as e:
                        raise e.error from None
                    except httpx.HTTPError as e:
                        cut = e.__context__ or e.__cause__
                        if isinstance(cut, BodyCut):
                            raise cut.error from None
                        kind: FailureKind = "connect" if isinstance(e, httpx.ConnectError) else "io"
                        last = f"{backend.id}: {type(e).__name__}: {e}"
                        self.core.health.failed_before_answer(backend, kind, last)
                        if _again(replayable, upload) and attempt + 1 < settings.max_attempts:
                            continue
                        break
                    retryable = resp.status_code in RETRYABLE_STATUS
                    again = _again(replayable, upload) and attempt + 1 < settings.max_attempts
                    if retryable and again:
                        last = f"{backend.id}: HTTP {resp.status_code}"
                        await resp.aclose()
                        continue
                    if resp.status_code not in RETRYABLE_STATUS:
                        self.core.health.succeeded(backend)
                    return await self._answer(ctx, resp, backend.id, send)
            finally:
                dispatch.release()
        message = f"no backend answered after {len(tried)} attempt(s)"
        if settings.error_details and last:
            message += f"; last error: {last}"
        raise ProxyError(502, message, type="upstream_error", code=502)

    def _backend_headers(
        self, headers: list[tuple[bytes, bytes]], attempt: int
    ) -> list[tuple[bytes, bytes]]:
        """The headers of one attempt: after the first, its x-request-id gets a suffix, so
        that a retry never shares an id with a request an engine may still hold."""
        out = headers
        if attempt:
            name, value = headers[-1]
            out = [*headers[:-1], (name, b"%s-%d" % (value, attempt))]
        if self._backend_auth is not None:
            out = [*out, (b"authorization", self._backend_auth.encode("latin-1"))]
        return out

    async def _answer(
        self, ctx: RequestContext, resp: httpx.Response, backend_id: str, send: Send
    ) -> int:
        """Relay the backend's answer as it comes; a backend breaking mid-way closes the
        client's connection short."""
        named = self.core.settings.backend_header
        out = response_headers(resp.headers.raw, ctx.request_id, backend_id if named else None)
        await send({"type": "http.response.start", "status": resp.status_code, "headers": out})
        try:
            async for piece in resp.aiter_raw():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except httpx.HTTPError as e:
            log.warning("request %s: %s broke mid-answer: %s", ctx.request_id, backend_id, e)
            return 502
        finally:
            await resp.aclose()
        await send({"type": "http.response.body", "body": b""})
        return resp.status_code


def _finished(model: str, tried: list[str], answered: bool) -> FinishedRequest:
    """An upload's request-log values: the backend that answered (the last one tried), and
    no token counts (the proxy does not read the answer)."""
    backends = tried[-1:] if answered else []
    return FinishedRequest(model, False, backends, len(tried), 0, None, 0, None, None)


def _again(replayable: bool, upload: Upload) -> bool:
    """Whether the body can be sent to another backend: held whole, or nothing of it has
    gone out yet (every byte read is still held)."""
    return replayable or upload.size == upload.held
