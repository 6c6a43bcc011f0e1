"""`fleet-proxy sim`: run N simulated vLLM engines in one process until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import signal
import sys
from collections.abc import Mapping

from fleet.types import Role
from simulator.faults import parse_fault_update
from simulator.fleet import DEFAULT_MODEL, start_fleet
from simulator.kv_events_config import KvEventsConfig, parse_kv_events_config
from simulator.lora import parse_lora_modules
from simulator.profiles import DEFAULT_PROFILE, Profile, available_profiles, load_profile


def runtime_lora_updates(env: Mapping[str, str]) -> bool:
    """vLLM's switch for the run-time LoRA routes, read by the simulator alike."""
    return env.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleet-proxy sim", description="Run simulated vLLM 0.32 engines, each on its own port."
    )
    p.add_argument("--engines", type=int, default=1, help="number of engines (default 1)")
    p.add_argument(
        "--base-port",
        type=int,
        default=8100,
        help="port of the first engine; the others follow (0: any free ports)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"one of {', '.join(available_profiles())}, or a YAML file",
    )
    p.add_argument(
        "--role",
        default=Role.BOTH.value,
        help="prefill, decode or both (default) for every engine, or one per "
        "engine separated by commas, e.g. prefill,decode,decode",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        help="engine clock speed relative to real time (default 1)",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name")
    p.add_argument(
        "--lora-modules",
        nargs="+",
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters served on top of the model, as vllm serve takes them",
    )
    p.add_argument(
        "--max-loras",
        type=int,
        default=1,
        help="most distinct LoRA adapters in one batch (default 1, as vLLM)",
    )
    p.add_argument(
        "--num-gpu-blocks",
        type=int,
        help="KV cache size in blocks of the profile's block_size, instead of the profile's "
        "(a small cache fills with a few requests)",
    )
    p.add_argument(
        "--kv-events-config",
        type=_kv_events_config,
        help='publish KV-cache events as vLLM does, e.g. \'{"enable_kv_cache_events": true, '
        '"publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": '
        '"tcp://*:5558", "topic": "kv"}\'; engine i uses the ports plus i, and a wildcard '
        "host is bound on --host",
    )
    p.add_argument(
        "--api-key",
        help="require `Authorization: Bearer KEY` on /v1/* as `vllm serve --api-key` does",
    )
    f = p.add_argument_group("faults (see docs/simulator.md; also settable at POST /_sim/faults)")
    f.add_argument(
        "--fault-engines",
        default="",
        help="comma-separated engine indexes the fault flags apply to (default all)",
    )
    f.add_argument("--fault-error-rate", type=float, help="fraction of requests answered 500")
    f.add_argument("--fault-slowdown", type=float, help="multiply every step's duration")
    f.add_argument("--fault-hang", action="store_true", help="accept but never answer")
    f.add_argument(
        "--fault-stall-generation",
        action="store_true",
        help="accept generation requests but never answer them; /health and /metrics answer",
    )
    f.add_argument(
        "--fault-metrics-unavailable",
        action="store_true",
        help="answer /metrics with 503 while serving everything else",
    )
    f.add_argument(
        "--fault-die-after-tokens",
        type=int,
        help="crash once a request has produced this many tokens",
    )
    f.add_argument(
        "--fault-cut-stream-after-tokens",
        type=int,
        help="drop each stream's connection after this many tokens",
    )
    f.add_argument(
        "--fault-recover-after",
        type=float,
        help="real seconds after a crash until the engine answers again",
    )
    return p


def _kv_events_config(text: str) -> KvEventsConfig:
    try:
        return parse_kv_events_config(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _fault_update(args: argparse.Namespace) -> dict[str, object]:
    raw = {
        "error_rate": args.fault_error_rate,
        "slowdown": args.fault_slowdown,
        "hang": True if args.fault_hang else None,
        "stall_generation": True if args.fault_stall_generation else None,
        "metrics_unavailable": True if args.fault_metrics_unavailable else None,
        "die_after_tokens": args.fault_die_after_tokens,
        "cut_stream_after_tokens": args.fault_cut_stream_after_tokens,
        "recover_after_s": args.fault_recover_after,
    }
    return parse_fault_update({k: v for k, v in raw.items() if v is not None})


def _roles(spec: str, engines: int) -> list[Role]:
    roles = [Role(r.strip()) for r in spec.split(",")]
    if len(roles) == 1:
        return roles * engines
    if len(roles) != engines:
        raise ValueError(f"--role names {len(roles)} roles for {engines} engines")
    return roles


def _profile(args: argparse.Namespace) -> Profile:
    profile = load_profile(args.profile)
    if args.num_gpu_blocks is not None:
        if args.num_gpu_blocks < 1:
            raise ValueError("--num-gpu-blocks must be at least 1")
        profile = profile.with_overrides(num_gpu_blocks=args.num_gpu_blocks)
    return profile


async def _serve(args: argparse.Namespace) -> int:
    try:
        fleet = await start_fleet(
            args.engines,
            base_port=args.base_port,
            host=args.host,
            profile=_profile(args),
            role=_roles(args.role, args.engines),
            speed=args.speed,
            model=args.model,
            api_key=args.api_key,
            lora=parse_lora_modules(
                args.lora_modules, args.max_loras, runtime_lora_updates(os.environ)
            ),
            kv_events=args.kv_events_config,
        )
    except OSError as e:  # a port taken, or an address this machine does not have
        print(f"fleet-proxy sim: cannot listen: {cannot_listen(e)}", file=sys.stderr)
        return 1
    update = _fault_update(args)
    targets = (
        {int(i) for i in args.fault_engines.split(",") if i.strip()}
        if args.fault_engines
        else set(range(args.engines))
    )
    for i, server in enumerate(fleet.engines):
        if update and i in targets:
            server.engine.faults.apply(update)
        print(server.url, flush=True)
        publisher = server.kv_publisher
        if publisher is not None:
            replay = (
                f", replays on {publisher.replay_endpoint}" if publisher.replay_endpoint else ""
            )
            print(
                f"{server.url} publishes KV events on {publisher.endpoint}{replay}",
                file=sys.stderr,
                flush=True,
            )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await fleet.close()
    return 0


def cannot_listen(e: OSError) -> str:
    """What a failed bind says, and what to do about it."""
    said = e.strerror or str(e)
    if e.errno == errno.EADDRINUSE:
        return f"{said}; pick other ports with --base-port, or --base-port 0 for any free ones"
    return f"{said}; check --host and --base-port"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    if args.engines < 1:
        print("--engines must be at least 1", file=sys.stderr)
        return 2
    try:
        _profile(args)
        _fault_update(args)
        _roles(args.role, args.engines)
        parse_lora_modules(args.lora_modules, args.max_loras)
    except ValueError as e:
        print(str(e), file=sys.stderr)
        return 2
    try:
        import uvloop  # faster event loop when installed (it comes with uvicorn[standard])
    except ImportError:
        return asyncio.run(_serve(args))
    return uvloop.run(_serve(args))
