"""A small vLLM-shaped HTTP server on a real socket, with switches for failure cases.

For the proxy's own edge cases (retries, mid-stream death, disconnects) where the simulator's
engine model would only add noise. Integration tests use the real simulator.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Behaviour:
    fail_status: int | None = None  # answer every request with this status
    fail_times: int = 0  # ...only this many times when > 0
    fail_text: str | None = None  # ...with this plain-text body, not an OpenAI error
    chunks: int = 8
    chunk_delay: float = 0.0
    first_byte_delay: float = 0.0
    die_after_chunks: int | None = None  # drop the connection mid-stream
    # A request whose body holds this text is a poison one: the backend drops the connection
    # before answering ("drop"), or after the head of a streamed answer ("cut").
    poison: str | None = None
    poison_mode: str = "drop"
    healthy: bool = True
    # Each generation request takes one permit before answering (None: none needed), so a
    # test lets requests finish one at a time.
    hold: asyncio.Semaphore | None = None


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeBackend:
    model: str = "fake-model"
    behaviour: Behaviour = field(default_factory=Behaviour)
    seen: list[Seen] = field(default_factory=list)
    active: int = 0
    cancelled: int = 0
    running_metric: float = 0.0
    metrics_status: int = 200
    url: str = ""
    prefix: str = ""  # serve under this path (a backend behind a path-routing gateway)
    # As `vllm serve --api-key`: /v1/* answers 401 without `Authorization: Bearer <key>`.
    api_key: str | None = None
    # (path, Authorization or None) of every request received, control plane included.
    authorizations: list[tuple[str, str | None]] = field(default_factory=list)
    _runner: web.AppRunner | None = None

    async def start(self) -> str:
        app = web.Application(middlewares=[self._check_key])
        self._routes(app)
        if self.prefix:
            root = web.Application()
            root.add_subapp(self.prefix, app)
            app = root
        # vLLM aborts a request whose client left, even before its first byte: so do we.
        self._runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = site._server.sockets  # type: ignore[union-attr]
        port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}{self.prefix}"
        return self.url

    @web.middleware
    async def _check_key(self, request: web.Request, handler: Any) -> web.StreamResponse:
        authorization = request.headers.get("Authorization")
        self.authorizations.append((request.path, authorization))
        refused = authorization != f"Bearer {self.api_key}"
        if self.api_key is not None and request.path.startswith("/v1") and refused:
            return web.json_response({"error": "Unauthorized"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    def paths_with(self, authorization: str | None) -> set[str]:
        """The paths requested with this Authorization value (None: without one)."""
        return {path for path, a in self.authorizations if a == authorization}

    def _routes(self, app: web.Application) -> None:
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_post("/v1/embeddings", self._echo)
        app.router.add_post("/tokenize", self._echo)
        app.router.add_post("/detokenize", self._echo)
        app.router.add_post("/v1/audio/transcriptions", self._transcribe)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.behaviour.healthy else 503)

    async def _models(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model"}]}
        )

    async def _metrics(self, _: web.Request) -> web.Response:
        if self.metrics_status != 200:
            return web.Response(status=self.metrics_status)
        m = self.model
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{engine="0",model_name="{m}"}} {self.running_metric}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{m}"}} 0.0\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{m}"}} 0.5\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def _echo(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append(
            Seen(request.path, {k.lower(): v for k, v in request.headers.items()}, body)
        )
        return web.json_response({"path": request.path, "echo": body})

    async def _transcribe(self, request: web.Request) -> web.Response:
        """An upload, read whole and kept by its size: its headers are what a test checks."""
        size = len(await request.read())
        self.seen.append(
            Seen(request.path, {k.lower(): v for k, v in request.headers.items()}, {"size": size})
        )
        return web.json_response({"text": "heard"})

    def _should_fail(self) -> int | None:
        b = self.behaviour
        if b.fail_status is None:
            return None
        if b.fail_times > 0:
            b.fail_times -= 1
            if b.fail_times == 0:
                status = b.fail_status
                b.fail_status = None
                return status
        return b.fail_status

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen.append(
            Seen(request.path, {k.lower(): v for k, v in request.headers.items()}, body)
        )
        b = self.behaviour
        poisoned = b.poison is not None and b.poison in json.dumps(body)
        if poisoned and b.poison_mode == "drop":
            assert request.transport is not None
            request.transport.close()
            raise ConnectionResetError("poisoned")
        status = self._should_fail()
        if status is not None:
            if self.behaviour.fail_text is not None:
                return web.Response(text=self.behaviour.fail_text, status=status)
            return web.json_response(
                {"error": {"message": "injected", "type": "x", "code": status}}, status=status
            )
        self.active += 1
        try:
            b = self.behaviour
            if b.hold is not None:
                await b.hold.acquire()
            if b.first_byte_delay:
                await asyncio.sleep(b.first_byte_delay)
            chat = request.path.endswith("chat/completions")
            if not body.get("stream"):
                text = "".join(f"t{i} " for i in range(b.chunks))
                choice: dict[str, Any] = (
                    {"index": 0, "message": {"role": "assistant", "content": text}}
                    if chat
                    else {"index": 0, "text": text}
                )
                choice["finish_reason"] = "length"
                return web.json_response(
                    {
                        "id": "cmpl-fake",
                        "object": "chat.completion" if chat else "text_completion",
                        "created": int(time.time()),
                        "model": self.model,
                        "choices": [choice],
                        "usage": {
                            "prompt_tokens": 3,
                            "completion_tokens": b.chunks,
                            "total_tokens": 3 + b.chunks,
                        },
                    }
                )
            resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await resp.prepare(request)
            if poisoned:
                assert request.transport is not None
                request.transport.close()
                return resp
            for i in range(b.chunks):
                if b.die_after_chunks is not None and i == b.die_after_chunks:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                delta = {"delta": {"content": f"t{i} "}} if chat else {"text": f"t{i} "}
                event = {
                    "id": "cmpl-fake",
                    "model": self.model,
                    "choices": [{"index": 0, **delta, "finish_reason": None}],
                }
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                if b.chunk_delay:
                    await asyncio.sleep(b.chunk_delay)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": 3,
                    "completion_tokens": b.chunks,
                    "total_tokens": 3 + b.chunks,
                }
                event = {"id": "cmpl-fake", "model": self.model, "choices": [], "usage": usage}
                await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        except (asyncio.CancelledError, ConnectionResetError):
            # Either way the client (the proxy) closed the connection mid-request.
            self.cancelled += 1
            raise
        finally:
            self.active -= 1
