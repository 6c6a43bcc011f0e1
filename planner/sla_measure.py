"""The measuring side of `fleet-proxy profile-sla`: requests to one engine over HTTP (aiohttp,
streaming), and the simulated engine as a child process. What to measure and what the numbers
mean is planner.sla_choice's; this module only times requests.

Prompts are lists of token ids drawn at random from ids the engine's own `/tokenize` gave for
plain English words, so their length is exact without tokenizing here, and no prompt shares a
cached prefix block with an earlier one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from bench.textgen import filler
from fleet.vllm_metrics import parse_engine_metrics
from planner.profile_file import ConfigProfile, DecodeData, PrefillData
from planner.sla_choice import (
    decode_prompt_lengths,
    fits_in_flight,
    in_flight_grid,
    isl_sweep,
    itl_after_all_started,
    median,
)

_POOL_TEXT_TOKENS = 2000
_SIM_START_S = 60.0
_SIM_STOP_S = 15.0


class EngineError(Exception):
    """The engine could not be profiled; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Plan:
    isl: int
    osl: int
    isl_factors: tuple[float, ...]
    context_factors: tuple[float, ...]
    repeats: int
    decode_tokens: int  # tokens each request of a decode run generates
    max_in_flight: int | None  # a cap under the KV capacity (None: the capacity)
    request_timeout_s: float  # bounds every request, and every decode run as a whole
    time_scale: float = 1.0  # engine seconds per measured second (a simulator's --speed)


@dataclass(frozen=True, slots=True)
class EngineInfo:
    url: str
    model: str
    max_model_len: int
    block_size: int
    num_gpu_blocks: int


async def _get(http: aiohttp.ClientSession, url: str, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s), http.get(url) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise EngineError(f"{url}: HTTP {resp.status}")
            return body
    except (aiohttp.ClientError, TimeoutError, OSError) as e:
        raise EngineError(f"cannot reach {url}: {type(e).__name__}: {e}".rstrip(": ")) from e


async def probe(http: aiohttp.ClientSession, url: str, timeout_s: float = 10.0) -> EngineInfo:
    """The served model, its context length and the KV cache geometry."""
    models = orjson.loads(await _get(http, f"{url}/v1/models", timeout_s))
    try:
        first = models["data"][0]
        model, max_len = str(first["id"]), int(first["max_model_len"])
    except (KeyError, IndexError, TypeError, ValueError) as e:
        raise EngineError(f"{url}/v1/models names no model with its max_model_len") from e
    metrics = parse_engine_metrics((await _get(http, f"{url}/metrics", timeout_s)).decode())
    if metrics.block_size is None or metrics.num_gpu_blocks is None:
        raise EngineError(f"{url}/metrics publishes no vllm:cache_config_info KV geometry")
    return EngineInfo(url, model, max_len, metrics.block_size, metrics.num_gpu_blocks)


async def token_pool(http: aiohttp.ClientSession, info: EngineInfo) -> tuple[int, ...]:
    text = filler("profile-sla", _POOL_TEXT_TOKENS)
    body = {"model": info.model, "prompt": text, "add_special_tokens": False}
    try:
        async with asyncio.timeout(10.0), http.post(f"{info.url}/tokenize", json=body) as resp:
            data = await resp.json(loads=orjson.loads)
    except (aiohttp.ClientError, TimeoutError, ValueError) as e:
        raise EngineError(f"{info.url}/tokenize failed: {type(e).__name__}: {e}") from e
    pool = tuple(sorted(set(data.get("tokens") or ())))
    if len(pool) < 2:
        raise EngineError(f"{info.url}/tokenize gave too few token ids to build prompts from")
    return pool


async def stream(
    http: aiohttp.ClientSession, info: EngineInfo, prompt: Sequence[int], max_tokens: int
) -> tuple[float, list[tuple[float, int]]]:
    """One streamed completion: (sent at, [(chunk time, completion tokens so far), ...]) for
    the chunks that carry tokens, on the perf_counter clock."""
    body: dict[str, Any] = {
        "model": info.model,
        "prompt": list(prompt),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks: list[tuple[float, int]] = []
    sent = time.perf_counter()
    async with http.post(f"{info.url}/v1/completions", data=orjson.dumps(body)) as resp:
        if resp.status != 200:
            detail = (await resp.read())[:200].decode("utf-8", "replace")
            raise EngineError(f"{info.url}: HTTP {resp.status}: {detail}")
        async for line in resp.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                return sent, chunks
            obj = orjson.loads(data)
            if not obj.get("choices"):
                continue  # the closing usage chunk
            usage = obj.get("usage") or {}
            done = usage.get("completion_tokens")
            chunks.append((time.perf_counter(), int(done) if done else len(chunks) + 1))
    raise EngineError(f"{info.url}: a stream ended before [DONE]")


async def _bounded(what: str, timeout_s: float, aw: Any) -> Any:
    try:
        async with asyncio.timeout(timeout_s):
            return await aw
    except TimeoutError as e:
        raise EngineError(f"{what} took over {timeout_s:g} s (--request-timeout)") from e
    except aiohttp.ClientError as e:
        raise EngineError(f"{what}: {type(e).__name__}: {e}") from e


async def ttft(
    http: aiohttp.ClientSession, info: EngineInfo, prompt: Sequence[int], plan: Plan
) -> float:
    """Seconds to the first token of `prompt` alone on the engine."""
    sent, chunks = await _bounded(
        f"a prefill of {len(prompt)} tokens",
        plan.request_timeout_s,
        stream(http, info, prompt, 1),
    )
    if not chunks:
        raise EngineError(f"{info.url}: a stream carried no token")
    return float((chunks[0][0] - sent) * plan.time_scale)


async def decode_itl(
    http: aiohttp.ClientSession, info: EngineInfo, prompts: Sequence[Sequence[int]], plan: Plan
) -> float | None:
    """ITL with len(prompts) requests decoding together: the prompts are prefilled once (their
    blocks stay cached), then all are streamed at once and timed after every one has begun."""
    what = f"a decode run of {len(prompts)} requests"
    await _bounded(
        what, plan.request_timeout_s, asyncio.gather(*(stream(http, info, p, 1) for p in prompts))
    )
    runs = await _bounded(
        what,
        plan.request_timeout_s,
        asyncio.gather(*(stream(http, info, p, plan.decode_tokens) for p in prompts)),
    )
    itl = itl_after_all_started([chunks for _, chunks in runs])
    return None if itl is None else itl * plan.time_scale


async def profile_engine(
    url: str,
    name: str,
    num_gpu: int,
    plan: Plan,
    say: Callable[[str], None],
    api_key: str | None = None,
) -> ConfigProfile:
    """Prefill TTFT over the ISL sweep and decode ITL over the in-flight grid, on one engine;
    `api_key` for an engine started with `--api-key`."""
    rng = random.Random()  # seeded from the OS: no earlier run's prompt comes back
    connector = aiohttp.TCPConnector(limit=0)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    async with aiohttp.ClientSession(connector=connector, headers=headers) as http:
        info = await probe(http, url)
        pool = await token_pool(http, info)

        def prompt(n: int) -> list[int]:
            return rng.choices(pool, k=n)

        prefill: list[tuple[float, float]] = []
        for isl in isl_sweep(plan.isl, plan.isl_factors, info.max_model_len):
            times = [await ttft(http, info, prompt(isl), plan) for _ in range(plan.repeats)]
            prefill.append((float(isl), median(times)))
            say(f"{name}: prefill ISL {isl}: TTFT {prefill[-1][1] * 1e3:.1f} ms")

        curves: list[tuple[float, tuple[tuple[float, float], ...]]] = []
        lengths = decode_prompt_lengths(
            plan.isl + plan.osl / 2, plan.context_factors, plan.decode_tokens, info.max_model_len
        )
        for length in lengths:
            context = length + plan.decode_tokens / 2
            most = fits_in_flight(info.num_gpu_blocks, info.block_size, length + plan.decode_tokens)
            if plan.max_in_flight is not None:
                most = min(most, plan.max_in_flight)
            curve: list[tuple[float, float]] = []
            for n in in_flight_grid(most):
                itl = await decode_itl(http, info, [prompt(length) for _ in range(n)], plan)
                if itl is None:
                    say(f"{name}: decode context {context:g}, {n} in flight: not all ran at once")
                    continue
                curve.append((float(n), itl))
                say(f"{name}: decode context {context:g}, {n} in flight: ITL {itl * 1e3:.2f} ms")
            if curve:
                curves.append((context, tuple(curve)))
        if not curves:
            raise EngineError(f"{url}: no decode run could be timed")
        return ConfigProfile(
            name=name,
            num_gpu=num_gpu,
            prefill=PrefillData(points=tuple(prefill)),
            decode=DecodeData(
                kv_tokens=info.num_gpu_blocks * info.block_size, curves=tuple(curves)
            ),
        )


@contextlib.asynccontextmanager
async def simulated_engine(profile: str, speed: float) -> AsyncIterator[str]:
    """`fleet-proxy sim` with one engine of `profile` on a free loopback port, for the block;
    then stopped by its PID (SIGTERM, SIGKILL if it lingers)."""
    with tempfile.TemporaryFile() as errors:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "proxy.serving.cli",
            "sim",
            "--engines=1",
            "--base-port=0",
            "--host=127.0.0.1",
            f"--profile={profile}",
            f"--speed={speed}",
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
        try:
            assert proc.stdout is not None
            try:
                async with asyncio.timeout(_SIM_START_S):
                    line = await proc.stdout.readline()  # its URL, once it listens
            except TimeoutError:
                line = b""
            url = line.decode().strip()
            if not url.startswith("http://"):
                errors.seek(0)
                tail = errors.read().decode("utf-8", "replace").strip().splitlines()[-1:]
                raise EngineError(f"the simulator with profile {profile} did not start: {tail}")
            yield url
        finally:
            if proc.returncode is None:
                proc.terminate()
                try:
                    async with asyncio.timeout(_SIM_STOP_S):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
