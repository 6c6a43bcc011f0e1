"""Replay a workload against one OpenAI base URL and emit one RequestRecord per request.

Open loop: sessions start at their arrival offsets (trace timestamps or Poisson), optionally
capped at `max_sessions` in flight (a capped session starts late; `scheduled_s` keeps the
time it wanted, so the delay is visible as send_delay in the summary). Closed loop:
`concurrency` workers each run one session at a time, back to back.
Within a session, turns are sequential; a turn's parallel calls are sent together.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from bench.client import RawResponse, decision_of, stream_request
from bench.metrics import derive
from bench.records import RequestRecord
from bench.textgen import tokens_for_chars
from bench.workload import Session, Turn, Workload


@dataclass(frozen=True, slots=True)
class RunOptions:
    base_url: str  # e.g. http://127.0.0.1:8000 (with or without /v1)
    model: str
    api: str = "chat"  # "chat" | "completions"
    mode: str = "open"  # "open" | "closed"
    concurrency: int = 8  # closed loop
    max_sessions: int | None = None  # open loop cap on sessions in flight
    history: str = "dataset"  # "dataset" | "actual": which reply enters the next turn
    timeout_s: float = 300.0
    duration_s: float | None = None  # start no new session after this
    ignore_eos: bool = True  # so the output length is the asked one
    headers: Mapping[str, str] = field(default_factory=dict)

    def endpoint(self) -> str:
        base = self.base_url.rstrip("/")
        if not base.endswith("/v1"):
            base += "/v1"
        return base + ("/chat/completions" if self.api == "chat" else "/completions")


def build_body(
    opts: RunOptions, session: Session, history: list[tuple[str, str]], user: str, max_tokens: int
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": opts.model,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.0,
    }
    if opts.ignore_eos:
        body["ignore_eos"] = True
    if opts.api == "chat":
        messages = [{"role": "system", "content": session.system}] if session.system else []
        for u, a in history:
            messages += [{"role": "user", "content": u}, {"role": "assistant", "content": a}]
        messages.append({"role": "user", "content": user})
        body["messages"] = messages
    elif not session.system and not history:
        body["prompt"] = user  # a single raw prompt: its length is exactly the trace's
    else:
        parts = [session.system] if session.system else []
        for u, a in history:
            parts += [f"User: {u}", f"Assistant: {a}"]
        parts.append(f"User: {user}\nAssistant:")
        body["prompt"] = "\n".join(parts)
    return body


def prompt_chars(body: Mapping[str, Any]) -> int:
    if "messages" in body:
        return sum(len(m["content"]) for m in body["messages"])
    return len(body["prompt"])


class Replay:
    def __init__(
        self,
        opts: RunOptions,
        setting: str,
        repeat: int,
        on_record: Callable[[RequestRecord], None],
    ) -> None:
        self.opts = opts
        self.setting = setting
        self.repeat = repeat
        self._on_record = on_record
        self._t0 = 0.0
        self._url = opts.endpoint()

    def _now(self) -> float:
        return time.perf_counter() - self._t0

    async def run(self, workload: Workload) -> None:
        self._t0 = time.perf_counter()
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            if self.opts.mode == "closed":
                await self._closed(http, workload)
            else:
                await self._open(http, workload)

    def _expired(self) -> bool:
        return self.opts.duration_s is not None and self._now() >= self.opts.duration_s

    async def _open(self, http: aiohttp.ClientSession, workload: Workload) -> None:
        cap = asyncio.Semaphore(self.opts.max_sessions) if self.opts.max_sessions else None

        async def capped(session: Session) -> None:
            try:
                await self._session(http, session, session.arrival_s)
            finally:
                if cap is not None:
                    cap.release()

        async with asyncio.TaskGroup() as tg:
            for session in sorted(workload.sessions, key=lambda s: s.arrival_s):
                delay = session.arrival_s - self._now()
                if delay > 0:
                    await asyncio.sleep(delay)
                if self._expired():
                    break
                if cap is not None:
                    await cap.acquire()
                tg.create_task(capped(session))

    async def _closed(self, http: aiohttp.ClientSession, workload: Workload) -> None:
        queue = list(reversed(workload.sessions))

        async def worker() -> None:
            while queue and not self._expired():
                session = queue.pop()
                await self._session(http, session, self._now())

        async with asyncio.TaskGroup() as tg:
            for _ in range(max(1, self.opts.concurrency)):
                tg.create_task(worker())

    async def _session(
        self, http: aiohttp.ClientSession, session: Session, scheduled: float
    ) -> None:
        history: list[tuple[str, str]] = []
        for index, turn in enumerate(session.turns):
            if index and session.think_time_s > 0:
                await asyncio.sleep(session.think_time_s)
                scheduled = self._now()
            if index and self._expired():
                return
            results = await asyncio.gather(
                *(
                    self._call(http, session, history, index, call, user, turn, scheduled)
                    for call, user in enumerate((turn.user, *turn.parallel))
                )
            )
            main = results[0]
            if main.error is not None:
                return  # a real client would not continue a conversation that failed
            reply = main.text if self.opts.history == "actual" else turn.reply
            history.append((turn.user, reply))
            scheduled = self._now()

    async def _call(
        self,
        http: aiohttp.ClientSession,
        session: Session,
        history: list[tuple[str, str]],
        turn_index: int,
        call: int,
        user: str,
        turn: Turn,
        scheduled: float,
    ) -> RawResponse:
        body = build_body(self.opts, session, history, user, turn.max_tokens)
        headers = {**self.opts.headers, **session.headers}
        record = RequestRecord(
            setting=self.setting,
            repeat=self.repeat,
            session_id=session.id,
            turn=turn_index,
            call=call,
            scheduled_s=scheduled,
            sent_s=self._now(),
            est_prompt_tokens=tokens_for_chars(prompt_chars(body)),
        )
        try:
            raw = await stream_request(
                http,
                self._url,
                body,
                headers,
                self.opts.timeout_s,
                keep_text=self.opts.history == "actual" and call == 0,
            )
        except asyncio.CancelledError:
            record.error = "cancelled"
            self._on_record(record)
            raise
        fill_record(record, raw, self._t0)
        self._on_record(record)
        return raw


def fill_record(record: RequestRecord, raw: RawResponse, t0: float) -> None:
    record.sent_s = raw.sent - t0
    record.status = raw.status
    record.backend = raw.backend
    record.request_id = raw.request_id
    record.decision = decision_of(raw.decision)
    record.error = raw.error
    usage = raw.usage or {}
    record.usage_reported = bool(raw.usage)
    record.prompt_tokens = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    record.completion_tokens = completion if completion is not None else len(raw.content_times)
    d = derive(raw.sent, raw.content_times, raw.end, record.completion_tokens)
    record.e2e_s = d.e2e
    if raw.error is None:
        record.ttft_s = d.ttft
        record.tpot_s = d.tpot
        record.itl_s = d.itls
        if d.ttft is None:
            record.error = "no content"
