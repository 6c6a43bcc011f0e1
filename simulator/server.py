"""The HTTP face of one simulated engine, on aiohttp.web (light enough for thousands of
concurrent streams in one process), answering as `vllm serve` does.

Admin endpoints, not in vLLM, live under `/_sim/`: faults, state, and the KV pull that a
decode engine sends to a prefill engine (our stand-in for NIXL's side channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import BodyPartReader, web

from fleet.types import Role
from simulator.anthropic_api import (
    MESSAGES,
    MessageEvents,
    anthropic_error_body,
    error_answer,
    message,
)
from simulator.anthropic_api import chat_body as messages_chat_body
from simulator.audio_api import AudioRequest, stream_events, whole_answer
from simulator.engine import Engine
from simulator.faults import FaultState, parse_fault_update
from simulator.kv_publisher import KvEventPublisher
from simulator.lora import AdapterError
from simulator.metrics import METRICS_CONTENT_TYPE
from simulator.openai_api import (
    CHAT,
    COMPLETIONS,
    VLLM_VERSION,
    ApiError,
    ChunkWriter,
    ParsedRequest,
    error_body,
    full_response,
    parse_request,
    response_id,
    sse,
    unknown_model,
)
from simulator.pooling_api import ROUTES_BY_TASK
from simulator.request import SimRequest
from simulator.responses_api import EventWriter, ResponseShape
from simulator.responses_api import chat_body as responses_chat_body

_SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@web.middleware
async def _fastapi_not_found(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """A path the engine does not serve, answered as vLLM's FastAPI does."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return _json({"detail": "Not Found"}, 404)


class StreamWriter(Protocol):
    """The bytes of one streamed answer, in an API's shape (openai_api.ChunkWriter,
    anthropic_api.MessageEvents)."""

    completion_tokens: int

    def head(self) -> bytes: ...

    def token_bytes(
        self,
        token_ids: list[int],
        text: str,
        finish_reason: str | None,
        stop_reason: int | str | None,
    ) -> bytes: ...

    def tail(self) -> bytes: ...


class _StreamCut(Exception):
    """A fault cut this stream."""


class EngineServer:
    """One engine on its own port. `crash()` and `recover()` emulate a dying process."""

    def __init__(
        self,
        engine: Engine,
        host: str,
        port: int,
        role: Role = Role.BOTH,
        api_key: str | None = None,
        kv_publisher: KvEventPublisher | None = None,
    ) -> None:
        self.engine = engine
        # The engine's KV-event sockets, when it publishes (started and closed with it).
        self.kv_publisher = kv_publisher
        # As `vllm serve --api-key`: /v1/* needs `Authorization: Bearer <key>`, other paths
        # (/health, /metrics, /tokenize...) stay open.
        self.api_key = api_key
        self.host = host
        self.port = port
        self.role = role
        self.in_flight = 0
        self.crashed = False
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._recover_task: asyncio.Task[None] | None = None
        self._crash_task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def faults(self) -> FaultState:
        return self.engine.faults

    # ---- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        middlewares = [_fastapi_not_found, self._hang_middleware]
        if self.api_key is not None:
            middlewares.insert(0, self._key_middleware)
        app = web.Application(middlewares=middlewares, client_max_size=64 << 20)
        r = app.router
        r.add_get("/health", self._health)
        r.add_get("/ping", self._health)
        r.add_get("/version", self._version)
        r.add_get("/v1/models", self._models)
        r.add_get("/load", self._load)
        r.add_get("/metrics", self._metrics)
        r.add_post("/tokenize", self._tokenize)
        r.add_post("/detokenize", self._detokenize)
        # As vLLM: an engine registers the routes of its model's tasks only, and answers the
        # others with FastAPI's bare 404.
        if self.engine.profile.runner == "pooling":
            for path in ROUTES_BY_TASK[self.engine.profile.pooling_task]:
                r.add_post(path, self._pooling)
        else:
            r.add_post("/v1/completions", self._completions)
            r.add_post("/v1/chat/completions", self._chat)
            r.add_post("/v1/responses", self._responses)
            r.add_post("/v1/audio/transcriptions", self._transcription)
            r.add_post("/v1/audio/translations", self._translation)
            r.add_post("/v1/messages", self._messages)
            r.add_post("/v1/messages/count_tokens", self._count_message_tokens)
        if self.engine.lora.runtime_updates:
            r.add_post("/v1/load_lora_adapter", self._load_lora)
            r.add_post("/v1/unload_lora_adapter", self._unload_lora)
        r.add_post("/inference/v1/abort_requests", self._abort_requests)
        r.add_post("/reset_prefix_cache", self._reset_prefix_cache)
        r.add_get("/_sim/faults", self._get_faults)
        r.add_post("/_sim/faults", self._set_faults)
        r.add_delete("/_sim/faults", self._clear_faults)
        r.add_get("/_sim/state", self._state)
        r.add_post("/_sim/kv/pull", self._kv_pull)
        # handler_cancellation: a client that disconnects cancels its handler at once, which
        # aborts its request in the engine (vLLM does the same on disconnect).
        self._runner = web.AppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await self._listen()
        if self.kv_publisher is not None:
            self.kv_publisher.start()
        self.engine.start()

    async def _listen(self) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, backlog=4096)
        await site.start()
        self._site = site
        if self.port == 0:
            server = site._server
            assert server is not None
            sockets = getattr(server, "sockets", None) or []
            self.port = int(sockets[0].getsockname()[1])

    async def close(self) -> None:
        for task in (self._recover_task, self._crash_task):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        await self.engine.stop()
        if self.kv_publisher is not None:
            await self.kv_publisher.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def crash(self, recover_after_s: float | None = None) -> None:
        """Stop answering: refuse new connections, cut open ones, forget all requests."""
        if self.crashed:
            return
        self.crashed = True
        self.engine.faults.settings.crash = True
        if self._site is not None:
            await self._site.stop()
            self._site = None
        if self._runner is not None and self._runner.server is not None:
            for handler in list(self._runner.server.connections):
                transport = handler.transport
                if transport is not None:
                    transport.abort()
        self.engine.reset()
        if recover_after_s is not None:
            self._recover_task = asyncio.get_running_loop().create_task(
                self._recover_later(recover_after_s)
            )

    async def _recover_later(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.recover()

    async def recover(self) -> None:
        """Answer again, as a freshly restarted engine on the same port."""
        if not self.crashed:
            return
        settings = self.engine.faults.settings
        settings.crash = False
        settings.die_after_tokens = None  # otherwise the restarted engine would die again
        await self._listen()
        self.crashed = False

    def _crash_soon(self) -> None:
        if self._crash_task is None or self._crash_task.done():
            delay = self.engine.faults.settings.recover_after_s
            self._crash_task = asyncio.get_running_loop().create_task(self.crash(delay))

    # ---- middleware -------------------------------------------------------------------------
    @web.middleware
    async def _hang_middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if not request.path.startswith("/_sim/"):
            await self.engine.faults.unhung.wait()
        return await handler(request)

    @web.middleware
    async def _key_middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        if request.method != "OPTIONS" and request.path.startswith("/v1"):
            scheme, _, key = request.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                key.encode(), (self.api_key or "").encode()
            ):
                return _json({"error": "Unauthorized"}, status=401)  # vLLM's own answer
        return await handler(request)

    # ---- plain endpoints ----------------------------------------------------------------------
    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _version(self, request: web.Request) -> web.Response:
        return _json({"version": VLLM_VERSION})

    async def _models(self, request: web.Request) -> web.Response:
        name = self.engine.model_name
        created = int(time.time())
        base = _model_card(name, name, None, self.engine.profile.max_model_len, created)
        # vLLM lists each LoRA adapter after the base model, with its path as root.
        adapters = [
            _model_card(lora, path, name, None, created)
            for lora, path in self.engine.adapters.paths.items()
        ]
        return _json({"object": "list", "data": [base, *adapters]})

    async def _load(self, request: web.Request) -> web.Response:
        return _json({"server_load": self.in_flight})

    async def _load_lora(self, request: web.Request) -> web.Response:
        return await self._change_lora(request, load=True)

    async def _unload_lora(self, request: web.Request) -> web.Response:
        return await self._change_lora(request, load=False)

    async def _change_lora(self, request: web.Request, *, load: bool) -> web.Response:
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict) or not isinstance(body.get("lora_name"), str):
                raise ApiError("'lora_name' is required")
            name: str = body["lora_name"]
            if load:
                path = body.get("lora_path")
                if not isinstance(path, str) or not path:
                    raise ApiError("Both 'lora_name' and 'lora_path' must be provided.")
                self.engine.adapters.load(name, path)
            else:
                self.engine.adapters.unload(name)
        except ApiError as e:
            return _json(e.body(), e.status)
        except AdapterError as e:
            return _json(error_body(str(e), e.status), e.status)
        # vLLM answers a plain text body.
        done = "added" if load else "removed"
        return web.Response(text=f"Success: LoRA adapter '{name}' {done} successfully.")

    async def _transcription(self, request: web.Request) -> web.StreamResponse:
        return await self._speech_to_text(request, "transcription")

    async def _translation(self, request: web.Request) -> web.StreamResponse:
        return await self._speech_to_text(request, "translation")

    async def _speech_to_text(self, request: web.Request, task: str) -> web.StreamResponse:
        engine = self.engine
        req = AudioRequest(task)
        try:
            reader = await request.multipart()
        except (AssertionError, ValueError, KeyError) as e:
            return _json(error_body(f"expected multipart/form-data: {e}", 400), 400)
        while True:
            part = await reader.next()
            if part is None:
                break
            if not isinstance(part, BodyPartReader) or part.name is None:
                continue
            if part.filename is not None or part.name == "file":
                req.has_file = True
                # Read to its end without holding it, as a bounded-memory engine would.
                while chunk := await part.read_chunk(1 << 16):
                    req.file_bytes += len(chunk)
            else:
                req.fields[part.name] = (await part.read()).decode("utf-8", "replace")
        if not req.has_file:
            return _json(error_body("Field required: file", 400, "file"), 400)
        model = req.model or engine.model_name
        if model != engine.model_name and model not in engine.adapters.paths:
            return _json(unknown_model(model, engine.model_name).body(), 404)
        if engine.faults.should_error():
            return _json(error_body("simulated engine error", 500), 500)
        if req.stream:
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            for event in stream_events(req, model):
                await resp.write(sse(event))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        if req.response_format == "text":
            return web.Response(text=req.text(), content_type="text/plain")
        return _json(whole_answer(req))

    async def _metrics(self, request: web.Request) -> web.Response:
        if self.engine.faults.settings.metrics_unavailable:
            return _json(error_body("metrics are unavailable (simulated fault)", 503), 503)
        body = self.engine.metrics.render(self.engine.core)
        return web.Response(body=body, headers={"Content-Type": METRICS_CONTENT_TYPE})

    async def _read_json(self, request: web.Request) -> Any:
        try:
            return orjson.loads(await request.read())
        except orjson.JSONDecodeError as e:
            raise ApiError(f"invalid JSON: {e}") from e

    async def _tokenize(self, request: web.Request) -> web.Response:
        tok = self.engine.tokenizer
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict):
                raise ApiError("the request body must be a JSON object")
            if "messages" in body:
                ids = parse_request(
                    CHAT,
                    {**body, "model": self.engine.model_name},
                    tok,
                    self.engine.model_name,
                    1 << 62,
                ).prompt_ids
            else:
                prompt = body.get("prompt")
                if not isinstance(prompt, str):
                    raise ApiError("prompt must be a string", param="prompt")
                ids = tok.encode(prompt, add_bos=body.get("add_special_tokens", True) is not False)
        except ApiError as e:
            return _json(e.body(), e.status)
        strs = [tok.piece(t) for t in ids] if body.get("return_token_strs") else None
        return _json(
            {
                "count": len(ids),
                "max_model_len": self.engine.profile.max_model_len,
                "tokens": ids,
                "token_strs": strs,
            }
        )

    async def _detokenize(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
            tokens = body.get("tokens") if isinstance(body, dict) else None
            if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
                raise ApiError("tokens must be a list of integers", param="tokens")
        except ApiError as e:
            return _json(e.body(), e.status)
        return _json({"prompt": self.engine.tokenizer.decode(tokens)})

    async def _abort_requests(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
        except ApiError as e:
            return _json(e.body(), e.status)
        ids = body.get("request_ids") if isinstance(body, dict) else None
        if not isinstance(ids, list):
            return _json(error_body("request_ids must be a list", 400, "request_ids"), 400)
        aborted = []
        for rid in ids:
            for candidate in (str(rid), f"cmpl-{rid}", f"chatcmpl-{rid}"):
                if self.engine.abort(candidate):
                    aborted.append(rid)
                    break
        return _json({"aborted": aborted})

    async def _reset_prefix_cache(self, request: web.Request) -> web.Response:
        ok = self.engine.reset_prefix_cache()
        return web.Response(status=200 if ok else 409)

    # ---- admin ------------------------------------------------------------------------------
    async def _get_faults(self, request: web.Request) -> web.Response:
        return _json(self.engine.faults.settings.to_json())

    async def _set_faults(self, request: web.Request) -> web.Response:
        try:
            update = parse_fault_update(await self._read_json(request))
        except (ApiError, ValueError) as e:
            return _json(error_body(str(e), 400), 400)
        crash = update.pop("crash", False)
        self.engine.faults.apply(update)
        if crash:
            self._crash_soon()  # after this answer has been sent
        return _json(self.engine.faults.settings.to_json())

    async def _clear_faults(self, request: web.Request) -> web.Response:
        self.engine.faults.apply(
            {
                "hang": False,
                "stall_generation": False,
                "metrics_unavailable": False,
                "error_rate": 0.0,
                "slowdown": 1.0,
                "die_after_tokens": None,
                "cut_stream_after_tokens": None,
                "recover_after_s": None,
            }
        )
        return _json(self.engine.faults.settings.to_json())

    async def _state(self, request: web.Request) -> web.Response:
        core = self.engine.core
        c = core.counters
        return _json(
            {
                "engine_id": self.engine.engine_id,
                "role": str(self.role),
                "running": len(core.running),
                "waiting": core.num_waiting(),
                "kv_usage": core.pool.usage(),
                "free_blocks": core.pool.num_free,
                "num_blocks": core.pool.num_blocks,
                "held_for_transfer": len(core.held),
                "in_flight": self.in_flight,
                "steps": c.steps,
                "preemptions": c.preemptions,
                "prefix_queries": c.prefix_queries,
                "prefix_hits": c.prefix_hits,
                "generation_tokens": c.generation_tokens,
                "finished": c.finished,
                "lag_fraction": self.engine.lag_fraction(),
                "planned_busy_s": self.engine.planned_busy,
                "actual_busy_s": self.engine.actual_busy,
                "engine_time": self.engine.now(),
                "real_time": self.engine.time.now(),
                "behind_s": self.engine.behind(),
                "faults": self.engine.faults.settings.to_json(),
            }
        )

    async def _kv_pull(self, request: web.Request) -> web.Response:
        try:
            body = await self._read_json(request)
        except ApiError as e:
            return _json(e.body(), e.status)
        rid = body.get("remote_request_id") if isinstance(body, dict) else None
        req = self.engine.release_held(str(rid))
        if req is None:
            return _json(error_body(f"no blocks held for request {rid}", 404), 404)
        return _json({"num_tokens": req.num_computed})

    # ---- completions --------------------------------------------------------------------------
    async def _pooling(self, request: web.Request) -> web.Response:
        engine = self.engine
        try:
            body = await self._read_json(request)
            if not isinstance(body, dict):
                raise ApiError("the request body must be a JSON object")
            model = body.get("model", engine.model_name)
            if model != engine.model_name:
                raise unknown_model(model, engine.model_name)
            answer = ROUTES_BY_TASK[engine.profile.pooling_task][request.path]
            encode = engine.tokenizer.encode
            self.in_flight += 1
            try:
                # The engine's hand-off cost, so that a pooling request is in flight a while.
                await engine.time.sleep_until(engine.time.now() + engine.profile.request_overhead_s)
                result = answer(body, engine.model_name, encode, engine.profile.pooled_size)
            finally:
                self.in_flight -= 1
        except ApiError as e:
            return _json(e.body(), e.status)
        if engine.faults.should_error():
            return _json(error_body("simulated engine error", 500), 500)
        return _json(result)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, COMPLETIONS)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, CHAT)

    async def _generation_admitted(self) -> None:
        generating = self.engine.faults.generating
        if not generating.is_set():
            # Accepted, then no answer at all (not even its head) until the stall ends; it
            # counts as in flight meanwhile, as on an engine whose core stopped stepping.
            self.in_flight += 1
            try:
                await generating.wait()
            finally:
                self.in_flight -= 1

    def _parse(self, kind: str, body: Any) -> ParsedRequest:
        engine = self.engine
        return parse_request(
            kind,
            body,
            engine.tokenizer,
            engine.model_name,
            engine.profile.max_model_len,
            engine.adapters.paths,
        )

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        """Anthropic's Messages API: served as the chat request it stands for (as vLLM)."""
        await self._generation_admitted()
        try:
            p = self._parse(CHAT, messages_chat_body(await self._read_json(request)))
        except ApiError as e:
            return _json(error_answer(e), e.status)
        if self.engine.faults.should_error():
            return _json(anthropic_error_body(ApiError("simulated engine error", 500)), 500)
        return await self._run(request, p, MESSAGES)

    async def _count_message_tokens(self, request: web.Request) -> web.Response:
        try:
            p = self._parse(CHAT, messages_chat_body(await self._read_json(request), counting=True))
        except ApiError as e:
            return _json(error_answer(e), e.status)
        n = len(p.prompt_ids)
        return _json({"input_tokens": n, "context_management": {"original_input_tokens": n}})

    async def _generate(self, request: web.Request, kind: str) -> web.StreamResponse:
        await self._generation_admitted()
        try:
            p = self._parse(kind, await self._read_json(request))
        except ApiError as e:
            return _json(e.body(), e.status)
        if self.engine.faults.should_error():
            return _json(error_body("simulated engine error", 500), 500)
        return await self._run(request, p, kind)

    async def _run(self, request: web.Request, p: ParsedRequest, api: str) -> web.StreamResponse:
        """Serve a parsed generation request; `api`: the answer's shape (completions, chat,
        or Anthropic's messages)."""
        engine = self.engine
        kind = p.kind
        base = request.headers.get("X-Request-Id") or uuid.uuid4().hex
        # aiohttp decodes header bytes as UTF-8 (surrogates for the rest); vLLM's server reads
        # them as latin-1, which any bytes are, so the id can go into JSON answers.
        base = base.encode("utf-8", "surrogateescape").decode("latin-1")
        rid = response_id(kind, base)
        req = engine.new_request(rid, p.prompt_ids, p.params)
        req.lora = p.lora
        if p.lora is not None:
            req.lora_id = engine.adapters.adapter_id(p.lora)
        kv = p.kv_transfer_params
        if kv and kv.get("do_remote_decode"):
            req.do_remote_decode = True
        self.in_flight += 1
        try:
            if kv and kv.get("do_remote_prefill") and kv.get("remote_host"):
                engine.submit_remote_prefill(req, kv)
            else:
                engine.submit(req)
            if api == MESSAGES:
                if p.stream:
                    return await self._stream(
                        request, req, MessageEvents(rid, p.model, req.prompt_ids)
                    )
                await self._finished(req)
                return _json(message(rid, p.model, req))
            if p.stream:
                return await self._stream(request, req, ChunkWriter(p, rid, req.prompt_ids))
            return await self._complete(p, rid, req)
        finally:
            self.in_flight -= 1
            if not req.finished:
                engine.abort(req.request_id)  # disconnected, cancelled or cut

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        """The Responses API over the chat template, as vLLM serves it for a text model."""
        engine = self.engine
        try:
            body = await self._read_json(request)
            p = self._parse(CHAT, responses_chat_body(body))
        except ApiError as e:
            return _json(e.body(), e.status)
        if engine.faults.should_error():
            return _json(error_body("simulated engine error", 500), 500)
        shape = ResponseShape(body, p.model)
        req = engine.new_request(shape.rid, p.prompt_ids, p.params)
        self.in_flight += 1
        try:
            engine.submit(req)
            if not body.get("stream"):
                while (await req.stream.get()).finish_reason is None:
                    pass
                n_in, n_out = len(req.prompt_ids), len(req.output_ids)
                return _json(shape.finished(req.output_text, req.finish_reason, n_in, n_out))
            resp = web.StreamResponse(headers=_SSE_HEADERS)
            await resp.prepare(request)
            writer = EventWriter(shape)
            await resp.write(writer.opening())
            limit = engine.faults.stream_limit()
            sent = 0
            while True:
                ev = await req.stream.get()
                if ev.text:
                    await resp.write(writer.delta(ev.text))
                sent += len(ev.token_ids)
                if limit is not None and sent >= limit:
                    if request.transport is not None:
                        request.transport.abort()  # a cut stream, as the fault asks
                    return resp
                if ev.finish_reason is not None:
                    break
            n_in, n_out = len(req.prompt_ids), len(req.output_ids)
            await resp.write(writer.closing(req.finish_reason, n_in, n_out))
            with contextlib.suppress(ConnectionResetError):
                await resp.write_eof()
            return resp
        except ConnectionResetError:
            return web.Response()  # the client went away; the request is aborted on exit
        finally:
            self.in_flight -= 1
            if not req.finished:
                engine.abort(req.request_id)

    async def _complete(self, p: ParsedRequest, rid: str, req: SimRequest) -> web.Response:
        await self._finished(req)
        kv_out = self._kv_out(req)
        return _json(full_response(p, rid, int(time.time()), req, kv_out))

    async def _finished(self, req: SimRequest) -> None:
        """Wait for a request's last token (a `die_after_tokens` fault crashes first)."""
        limit = self.engine.faults.settings.die_after_tokens
        while True:
            ev = await req.stream.get()
            if limit is not None and len(req.output_ids) >= limit:
                self._crash_soon()
                await asyncio.sleep(3600)  # the crash cancels this handler
            if ev.finish_reason is not None:
                break

    def _kv_out(self, req: SimRequest) -> dict[str, Any] | None:
        """What vLLM 0.32's NixlConnector answers on a prefill engine (block ids are given per
        KV-cache group: one group here)."""
        if not req.do_remote_decode or req.request_id not in self.engine.core.held:
            return None
        return {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": [list(req.blocks)],
            "remote_engine_id": self.engine.engine_id,
            "remote_request_id": req.request_id,
            "remote_host": self.host,
            "remote_port": self.port,
            "tp_size": 1,
            "dcp_size": 1,
            "pp_size": 1,
            "remote_num_tokens": len(req.prompt_ids),
            "remote_blocks_expiry_time": None,
            "transfer_mode": "pull",
            "remote_prefill_cached_tokens": req.prefix_hit_tokens,
        }

    async def _stream(
        self, request: web.Request, req: SimRequest, writer: StreamWriter
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers=_SSE_HEADERS)
        await resp.prepare(request)
        # vLLM sends a chat stream's opening (the assistant role) with the engine's first
        # output, after the prompt's prefill: a router that counts prefill work until the
        # first bytes sees it end when the engine's does.
        head = writer.head()
        faults = self.engine.faults
        tok = self.engine.tokenizer
        try:
            while True:
                ev = await req.stream.get()
                limit = faults.stream_limit()
                ids, text = ev.token_ids, ev.text
                finish, stop_reason = ev.finish_reason, ev.stop_reason
                cut = False
                if limit is not None and writer.completion_tokens + len(ids) >= limit:
                    ids = ids[: max(0, limit - writer.completion_tokens)]
                    text = "".join(tok.token_str(t) for t in ids)
                    finish = stop_reason = None
                    cut = True
                out = head
                head = b""
                if ids or finish is not None:
                    out += writer.token_bytes(ids, text, finish, stop_reason)
                if out:  # an empty write would end a chunked answer
                    await resp.write(out)
                if cut:
                    raise _StreamCut
                if ev.finish_reason is not None:
                    break
        except ConnectionResetError:
            return resp  # the client went away mid-write; the request is aborted on exit
        except _StreamCut:
            if (
                faults.settings.die_after_tokens is not None
                and writer.completion_tokens >= faults.settings.die_after_tokens
            ):
                self._crash_soon()
            if request.transport is not None:
                request.transport.abort()
            return resp
        await resp.write(writer.tail())
        with contextlib.suppress(ConnectionResetError):
            await resp.write_eof()
        return resp


def _model_card(
    model_id: str, root: str, parent: str | None, max_model_len: int | None, created: int
) -> dict[str, Any]:
    return {
        "id": model_id,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": root,
        "parent": parent,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
