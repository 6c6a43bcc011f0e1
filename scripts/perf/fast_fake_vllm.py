"""A deliberately minimal vLLM-shaped server for measuring a router's own overhead.

Written on raw asyncio protocols (not aiohttp/FastAPI) so the backend is never the bottleneck:
it answers /v1/completions and /v1/chat/completions with 16 tokens, or streams 64 SSE events
as separate writes (shaped as vLLM's, with token ids when the request asks `return_token_ids`),
and serves /health, /v1/models and a small /metrics for the proxy's scraper.

    python scripts/perf/fast_fake_vllm.py --port 9001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

import uvloop

MODEL = "fake-model"
TEXT16 = " ".join(f"tok{i}" for i in range(16))
COMPLETION = json.dumps(
    {
        "id": "cmpl-fake",
        "object": "text_completion",
        "model": MODEL,
        "choices": [{"index": 0, "text": TEXT16, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 8, "completion_tokens": 16, "total_tokens": 24},
    }
).encode()
MODELS = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
METRICS = (
    "# TYPE vllm:num_requests_running gauge\n"
    f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} 0.0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} 0.0\n'
).encode()


def _event(choice_tail: bytes) -> bytes:
    """One streamed event as vLLM 0.32 writes it (compact JSON, its key order)."""
    return (
        b'data: {"id":"cmpl-fake","object":"text_completion","created":1795319305,'
        b'"model":"' + MODEL.encode() + b'","choices":[{"index":0,"text":" tok",'
        b'"logprobs":null,"finish_reason":null,"stop_reason":null' + choice_tail + b"}]}\n\n"
    )


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


EVENT = _event(b"")
CHUNK = _chunk(EVENT)
# With "return_token_ids": true, as vLLM answers it: the prompt's ids on the first event, and
# each event's own token ids.
FIRST_IDS_CHUNK = _chunk(
    _event(
        b',"prompt_token_ids":['
        + b",".join(b"%d" % (1000 + i) for i in range(8))
        + b'],"token_ids":[4242]'
    )
)
IDS_CHUNK = _chunk(_event(b',"prompt_token_ids":null,"token_ids":[4242]'))
DONE = b"data: [DONE]\n\n"
LAST = b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE)
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def response(status: bytes, ctype: bytes, body: bytes) -> bytes:
    return b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s" % (
        status,
        ctype,
        len(body),
        body,
    )


class Handler(asyncio.Protocol):
    def __init__(self, chunks: int) -> None:
        self.buf = b""
        self.chunks = chunks
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: Any) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buf) < end + 4 + length:
                return
            body = self.buf[end + 4 : end + 4 + length]
            self.buf = self.buf[end + 4 + length :]
            method, path, _ = head.split(" ", 2)
            self.answer(method, path, body)

    def answer(self, method: str, path: str, body: bytes) -> None:
        t = self.transport
        assert t is not None
        if path.endswith("/completions") and method == "POST":
            compact = body.replace(b" ", b"")
            if b'"stream":true' in compact:
                ids = b'"return_token_ids":true' in compact
                asyncio.get_running_loop().create_task(self.stream(t, ids))
            else:
                t.write(response(b"200 OK", b"application/json", COMPLETION))
        elif path == "/health":
            t.write(response(b"200 OK", b"text/plain", b""))
        elif path == "/v1/models":
            t.write(response(b"200 OK", b"application/json", MODELS))
        elif path == "/metrics":
            t.write(response(b"200 OK", b"text/plain", METRICS))
        else:
            t.write(response(b"404 Not Found", b"text/plain", b"no"))

    async def stream(self, t: asyncio.Transport, ids: bool) -> None:
        t.write(STREAM_HEAD)
        for i in range(self.chunks):
            if t.is_closing():
                return
            t.write((FIRST_IDS_CHUNK if i == 0 else IDS_CHUNK) if ids else CHUNK)
            await asyncio.sleep(0)  # separate writes, as tokens come one by one
        t.write(LAST)


async def serve(port: int, chunks: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Handler(chunks), "127.0.0.1", port, backlog=4096)
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"fast fake vLLM on http://127.0.0.1:{port}", flush=True)
    async with server:
        await stop.wait()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--chunks", type=int, default=64)
    args = p.parse_args()
    uvloop.run(serve(args.port, args.chunks))


if __name__ == "__main__":
    main()
