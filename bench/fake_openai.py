"""A tiny OpenAI-compatible streaming server for the bench's own tests and client self-check.

Not the simulator: no batching or queueing model. It streams `max_tokens` one-token chunks
(optionally paced), reports usage, sets `x-fleet-backend`, and counts prefix-cache queries
and hits on 16-token (64-character) blocks so that /metrics snapshots have something real to
show.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

BLOCK_CHARS = 64
TOKEN_TEXT = "tok "


@dataclass
class FakeState:
    backend_id: str
    ttft_s: float = 0.0
    itl_s: float = 0.0
    cache_blocks: int = 100_000
    queries: int = 0
    hits: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    blocks: OrderedDict[int, None] = field(default_factory=OrderedDict)
    keep_prompts: bool = False  # tests: remember every prompt text received
    prompts: list[str] = field(default_factory=list)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def account_prompt(self, text: str) -> int:
        """Record the prompt's prefix-cache lookup; returns its token count."""
        tokens = (len(text) + 3) // 4
        self.queries += tokens
        self.prompt_tokens += tokens
        prev, matching = 0, True
        for start in range(0, len(text) - BLOCK_CHARS + 1, BLOCK_CHARS):
            prev = hash((prev, text[start : start + BLOCK_CHARS]))
            if matching and prev in self.blocks:
                self.hits += BLOCK_CHARS // 4
                self.blocks.move_to_end(prev)
            else:
                matching = False
                self.blocks[prev] = None
        while len(self.blocks) > self.cache_blocks:
            self.blocks.popitem(last=False)
        return tokens


def _prompt_text(body: dict[str, Any]) -> str:
    if "messages" in body:
        return "".join(str(m.get("content") or "") for m in body["messages"])
    return str(body.get("prompt") or "")


def make_app(state: FakeState) -> web.Application:
    async def generate(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        chat = request.path.endswith("/chat/completions")
        text = _prompt_text(body)
        if state.keep_prompts:
            state.prompts.append(text)
        prompt_tokens = state.account_prompt(text)
        n = int(body.get("max_tokens") or 16)
        state.requests += 1
        state.generation_tokens += n
        rid = request.headers.get("x-request-id") or f"fake-{next(state.ids)}"
        headers = {"x-fleet-backend": state.backend_id, "x-request-id": rid}
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": n,
            "total_tokens": prompt_tokens + n,
        }
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            text = TOKEN_TEXT * n
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": text}}
                if chat
                else {"index": 0, "text": text}
            )
            payload = {"id": rid, "object": kind, "choices": [choice], "usage": usage}
            return web.json_response(payload, headers=headers)
        resp = web.StreamResponse(headers={**headers, "content-type": "text/event-stream"})
        await resp.prepare(request)
        if state.ttft_s:
            await asyncio.sleep(state.ttft_s)
        chunk_kind = kind + (".chunk" if chat else "")
        for i in range(n):
            if i and state.itl_s:
                await asyncio.sleep(state.itl_s)
            choice = (
                {"index": 0, "delta": {"content": TOKEN_TEXT}}
                if chat
                else {"index": 0, "text": TOKEN_TEXT}
            )
            chunk = {"id": rid, "object": chunk_kind, "choices": [choice]}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):
            last = {"id": rid, "object": chunk_kind, "choices": [], "usage": usage}
            await resp.write(b"data: " + orjson.dumps(last) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def metrics(_: web.Request) -> web.Response:
        lab = '{model_name="fake",engine="0"}'
        lines = [
            f"vllm:prefix_cache_queries_total{lab} {state.queries}",
            f"vllm:prefix_cache_hits_total{lab} {state.hits}",
            f"vllm:prompt_tokens_total{lab} {state.prompt_tokens}",
            f"vllm:generation_tokens_total{lab} {state.generation_tokens}",
        ]
        text = "".join(
            f"# TYPE {line.split('{')[0].removesuffix('_total')} counter\n{line}\n"
            for line in lines
        )
        return web.Response(text=text, content_type="text/plain")

    async def health(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/v1/completions", generate)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    return app


async def start(
    state: FakeState, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, int]:
    """Start serving; returns the runner (call `cleanup()` to stop) and the bound port."""
    runner = web.AppRunner(make_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    # port 0: ask the runner which port the OS picked
    bound = int(runner.addresses[0][1])
    return runner, bound


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fleet-proxy bench fake-server")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--backend-id", default="")
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--itl-ms", type=float, default=0.0)
    return p


def serve_main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    async def run() -> None:
        state = FakeState(args.backend_id, args.ttft_ms / 1000, args.itl_ms / 1000)
        runner, port = await start(state, args.host, args.port)
        if not state.backend_id:
            state.backend_id = f"{args.host}:{port}"
        print(f"PORT {port}", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())
    return 0
