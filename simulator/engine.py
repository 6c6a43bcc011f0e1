"""One simulated engine: the core's step loop on an engine clock, request entry and exit,
and the decode side of P/D KV transfers.

The loop plans a step, waits until real time reaches its end on the engine clock, then applies
it with that end as its timestamp. Steps are paced against the engine clock, so a late wake-up
is made up by the next sleep; only a process that cannot keep up falls behind, and
`lag_fraction()` says by how much (1 - engine seconds / real seconds while busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from time import time as wall_time
from typing import Any, Protocol

import aiohttp

from fleet.kv_events import KvEvent
from simulator.core import EngineCore
from simulator.faults import FaultState
from simulator.lm import DeterministicLM
from simulator.lora import AdapterTable, LoraConfig
from simulator.metrics import SimMetrics
from simulator.profiles import Profile
from simulator.request import GenerationParams, SimRequest
from simulator.simtime import SimTime
from simulator.tokenizer import Tokenizer

# How often (real seconds) an idle engine wakes to expire P/D blocks nobody read.
_IDLE_WAKE_S = 1.0


class KvEventSink(Protocol):
    """Where an engine's KV-cache events go (simulator/kv_publisher.py)."""

    def publish(self, events: Sequence[KvEvent], ts: float) -> int: ...

    def restart(self) -> None: ...


class Engine:
    def __init__(
        self,
        *,
        profile: Profile,
        tokenizer: Tokenizer,
        time: SimTime,
        model_name: str,
        engine_id: str,
        lora: LoraConfig | None = None,
        kv_events: KvEventSink | None = None,
        wall_clock: Callable[[], float] = wall_time,
    ) -> None:
        self.profile = profile
        self.lora = lora or LoraConfig()
        self.adapters = AdapterTable(self.lora)  # served now: loads and unloads change it
        self.tokenizer = tokenizer
        self.lm = DeterministicLM(tokenizer.generatable, profile.eos_probability)
        self.time = time
        self.model_name = model_name
        self.engine_id = engine_id
        self.faults = FaultState()
        self.metrics = SimMetrics(model_name, profile, lora=self.lora)
        # Batches are stamped with wall-clock seconds, as vLLM stamps them.
        self.kv_events = kv_events
        self._wall_clock = wall_clock
        self.core = self._new_core()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._ids = itertools.count()
        self._session: aiohttp.ClientSession | None = None
        self._pulls: set[asyncio.Task[None]] = set()
        # Engine seconds the engine clock advanced while busy, and the real (scaled) seconds
        # that took: equal when the process keeps up.
        self.planned_busy = 0.0
        self.actual_busy = 0.0
        self.step_seconds = 0.0  # engine seconds spent in steps
        self._virtual: float | None = None
        self._real_mark: float | None = None  # real time the busy accounting has reached
        self._deadline: float | None = None  # engine time the step in progress ends
        # How far the engine clock may trail real time and still catch up (1 s real): a burst
        # of work (thousands of streams' tokens written at once) delays a step's wake-up by
        # tens of milliseconds; the next sleeps make that up.
        self._max_behind = 1.0 * time.speed

    # ---- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for pull in list(self._pulls):
            pull.cancel()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def reset(self) -> None:
        """Forget every request and all cache contents, as a restarted engine would."""
        for req in list(self.core.iter_requests()):
            self.core.abort(req.request_id)
        self.metrics = SimMetrics(self.model_name, self.profile, lora=self.lora)
        self.adapters = AdapterTable(self.lora)  # adapters loaded at run time are gone
        self.core = self._new_core()
        self.core.slowdown = self.faults.settings.slowdown
        if self.kv_events is not None:
            self.kv_events.restart()  # a new engine process numbers its batches from 0
        self._wake.set()

    def _new_core(self) -> EngineCore:
        max_loras = self.lora.max_loras if self.lora.enabled else None
        return EngineCore(
            self.profile,
            self.tokenizer,
            self.lm,
            self.metrics,
            max_loras,
            record_kv_events=self.kv_events is not None,
        )

    def flush_kv_events(self) -> None:
        """Publish what the cache did since the last flush as one batch (none if nothing)."""
        sink = self.kv_events
        if sink is not None:
            events = self.core.pool.take_events()
            if events:
                sink.publish(events, self._wall_clock())

    def reset_prefix_cache(self) -> bool:
        done = self.core.pool.reset_prefix_cache()
        self.flush_kv_events()
        return done

    # ---- requests ---------------------------------------------------------------------------
    def new_request(
        self, request_id: str, prompt_ids: list[int], params: GenerationParams
    ) -> SimRequest:
        if request_id in self.core.requests:  # a repeated X-Request-Id: keep ids unique
            request_id = f"{request_id}-{next(self._ids)}"
        now = self.time.now()  # arrivals are stamped in real (scaled) time
        return SimRequest(
            request_id=request_id,
            prompt_ids=prompt_ids,
            params=params,
            arrival=now,
            lm_state=self.lm.context_state(prompt_ids),
            ready_at=now + self.profile.request_overhead_s,
        )

    def submit(self, req: SimRequest) -> None:
        self.core.add_request(req)
        self._wake.set()

    def abort(self, request_id: str) -> bool:
        found = self.core.abort(request_id)
        if found:
            self._wake.set()
        return found

    def submit_remote_prefill(self, req: SimRequest, kv: dict[str, Any]) -> None:
        """Decode side of P/D: pull the prompt's KV from the prefill engine named in `kv`,
        then decode; if the blocks cannot be reserved or pulled, prefill locally."""
        to_load = self.core.begin_remote_prefill(req)
        self._wake.set()
        if to_load is None:
            return
        task = asyncio.get_running_loop().create_task(self._pull(req, kv, to_load))
        self._pulls.add(task)
        task.add_done_callback(self._pulls.discard)

    async def _pull(self, req: SimRequest, kv: dict[str, Any], to_load: int) -> None:
        ok = False
        try:
            if self._session is None:
                self._session = aiohttp.ClientSession()
            url = f"http://{kv['remote_host']}:{kv['remote_port']}/_sim/kv/pull"
            payload = {
                "remote_request_id": kv.get("remote_request_id"),
                "remote_block_ids": kv.get("remote_block_ids"),
                "remote_engine_id": kv.get("remote_engine_id"),
            }
            timeout = aiohttp.ClientTimeout(total=10)
            posted = self.time.now()
            async with self._session.post(url, json=payload, timeout=timeout) as resp:
                ok = resp.status == 200
            if ok:
                self.metrics.nixl_post_time.observe(self.time.now() - posted)
                nbytes = to_load * self.profile.kv_bytes_per_token
                seconds = nbytes / self.profile.kv_transfer_bandwidth_bytes_per_s
                await self.time.sleep_until(self.time.now() + seconds)
                self.metrics.nixl_xfer_time.observe(seconds)
                self.metrics.nixl_bytes.observe(nbytes)
                self.metrics.nixl_descriptors.observe(len(req.blocks))
        except (aiohttp.ClientError, TimeoutError, KeyError, OSError):
            ok = False
        if not ok:
            self.metrics.nixl_failed_transfers.inc()
        self.core.finish_remote_prefill(req, ok)
        self.flush_kv_events()
        self._wake.set()

    def release_held(self, request_id: str) -> SimRequest | None:
        req = self.core.release_held(request_id)
        if req is not None:
            self._wake.set()
        return req

    # ---- the step loop ----------------------------------------------------------------------
    def now(self) -> float:
        """The engine clock: the end of the last step while busy, the scaled real clock when
        idle. Behind real time only when the process could not keep up."""
        return self._virtual if self._virtual is not None else self.time.now()

    async def _run(self) -> None:
        while True:
            await self._wait_generating()
            core = self.core
            core.slowdown = self.faults.settings.slowdown
            real = self.time.now()
            if self._virtual is None:  # a busy period begins
                self._virtual = self._real_mark = real
            elif real - self._virtual > self._max_behind:
                # Too far behind to catch up (a starved process): carry on from now; the
                # skipped time shows in the lag.
                self._virtual = real
            now = self._virtual
            if core.held:
                core.expire_held(now)
            step = core.schedule(now)
            if step is None:
                ready_at = core.next_ready_at(now)
                if ready_at is not None:  # a request is still in the API server
                    self._deadline = ready_at
                    await self.time.sleep_until(ready_at)
                    self._advance(ready_at - now)
                    continue
                self._virtual = None
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), _IDLE_WAKE_S)
                continue
            # Steps follow each other on the engine clock, not from whenever the process woke
            # up: a late wake-up shortens the next sleep instead of stretching the timeline.
            end = self._deadline = now + step.duration
            self.step_seconds += step.duration
            await self.time.sleep_until(end)
            self._advance(step.duration)
            await self._wait_generating()  # a hang or stall that began mid-step holds its result
            if core is self.core:  # not reset (crash) while the step ran
                core.finish_step(step, end)
                self.flush_kv_events()  # one batch per step, as vLLM publishes

    async def _wait_generating(self) -> None:
        if not self.faults.generating.is_set():
            await self.faults.generating.wait()
            self._virtual = self._real_mark = None  # resume on real time; a hang is no lag

    def behind(self) -> float:
        """Engine seconds real time is past the end of the step in progress (0 when idle or
        on time): how late the engine clock is running."""
        if self._virtual is None or self._deadline is None:
            return 0.0
        return max(0.0, self.time.now() - self._deadline)

    def _advance(self, sim_seconds: float) -> None:
        """Account `sim_seconds` of engine time against the real time that passed."""
        assert self._virtual is not None and self._real_mark is not None
        self._virtual += sim_seconds
        real = self.time.now()
        self.planned_busy += sim_seconds
        self.actual_busy += max(real - self._real_mark, 0.0)
        self._real_mark = real

    def lag_fraction(self) -> float:
        """How much longer steps took than planned, as a fraction of the time they took."""
        if self.actual_busy <= 0:
            return 0.0
        return max(0.0, 1.0 - self.planned_busy / self.actual_busy)
