"""One request inside a simulated engine: its parameters, progress, cache blocks and timestamps."""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from simulator.kv_cache import BlockHash


class Status(Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class GenerationParams:
    max_tokens: int
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0


@dataclass(slots=True)
class TokenEvent:
    """What one engine step produced for a request: new tokens, their text, maybe the end."""

    token_ids: list[int]
    text: str
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class OutputStream:
    """Single-consumer channel from the engine loop to the HTTP handler.

    Events that arrive while the consumer is busy are merged into one, as vLLM's output
    collector does, so a slow client gets fewer, larger chunks instead of a growing backlog.
    """

    __slots__ = ("_events", "_waiter")

    def __init__(self) -> None:
        self._events: deque[TokenEvent] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, event: TokenEvent) -> None:
        if self._events:
            last = self._events[-1]
            last.token_ids.extend(event.token_ids)
            last.text += event.text
            last.finish_reason = event.finish_reason
            last.stop_reason = event.stop_reason
        else:
            self._events.append(event)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def get(self) -> TokenEvent:
        while not self._events:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._events.popleft()


@dataclass(eq=False, slots=True)
class SimRequest:
    request_id: str
    prompt_ids: list[int]
    params: GenerationParams
    arrival: float
    lm_state: int  # rolling hash of prompt + outputs so far
    ready_at: float = 0.0  # when the scheduler may first take it (arrival + API overhead)
    output_ids: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)  # output text, one piece per token
    emitted_chars: int = 0  # output text already streamed (requests with stop strings)
    num_tokens: int = -1  # prompt + outputs, kept up to date by the engine core
    status: Status = Status.WAITING
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[BlockHash] = field(default_factory=list)
    num_cached_blocks: int = 0  # leading blocks already registered in the prefix cache
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    # Timestamps in engine seconds.
    first_scheduled: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    num_preemptions: int = 0
    prefix_hit_tokens: int = 0  # prompt tokens found in the local prefix cache
    external_tokens: int = 0  # prompt tokens pulled from a prefill engine (P/D)
    # P/D: hold the blocks after finishing, for a decode engine to read.
    do_remote_decode: bool = False
    # P/D: where the prompt's KV was pulled from (decode side), and what the prefill answered.
    kv_transfer_params: dict[str, Any] | None = None
    lora: str | None = None  # the LoRA adapter the request names, if any
    lora_id: int | None = None  # and its integer id
    stream: OutputStream = field(default_factory=OutputStream)

    def __post_init__(self) -> None:
        self.num_tokens = len(self.prompt_ids) + len(self.output_ids)

    @property
    def output_text(self) -> str:
        return "".join(self.text_parts)

    def all_token_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED
