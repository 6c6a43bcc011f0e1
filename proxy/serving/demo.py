"""`fleet-proxy demo`: a simulated vLLM fleet plus the proxy, in one command.

The simulator runs as a child process (it gets the machine's other core); the proxy runs in
this one. Ctrl-C, SIGTERM or SIGHUP stops both; should the demo die without a word (SIGKILL,
the OOM killer), the kernel sends the simulator SIGTERM (proxy/serving/parent_death.py), so it does
not stay behind on its ports.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from proxy.serving.parent_death import die_with_parent
from proxy.serving.serve import run_serve
from proxy.settings import ConfigError, load_settings

GENERATION_MODEL = "sim-llama-8b"
# vLLM serves pooling routes (embeddings, score, rerank) only on engines running a pooling
# model, so the demo's fleet has one beside the generation engines.
EMBED_MODEL = "sim-embed"
EMBED_PROFILE = "cpu-tiny-embed"


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        # As the servers will bind: a port held only by closed connections (TIME_WAIT, as
        # after the last demo) is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def wait_healthy(urls: list[str], timeout: float, child: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the simulator exited with code {child.returncode}")
        url = pending[0]
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                if r.status == 200:
                    pending.pop(0)
                    continue
        except OSError:
            pass
        time.sleep(0.1)
    if pending:
        raise RuntimeError(f"simulated engines not healthy after {timeout:.0f}s: {pending}")


def _exit_on_signal(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleet-proxy demo",
        description="Start a simulated vLLM fleet and fleet-proxy in front of it.",
    )
    p.add_argument("--port", type=int, default=8000, help="proxy port (default 8000)")
    p.add_argument("--host", default="127.0.0.1", help="proxy address (default 127.0.0.1)")
    p.add_argument("--engines", type=int, default=4, help="simulated engines (default 4)")
    p.add_argument("--sim-base-port", type=int, default=8101, help="first engine port (8101)")
    p.add_argument("--profile", default="h100-llama-8b", help="simulator performance profile")
    p.add_argument("--speed", type=float, default=1.0, help="simulated clock speed-up")
    p.add_argument("--policy", default=None, help="routing policy (default: the proxy's)")
    p.add_argument(
        "--embedding-engines",
        type=int,
        default=1,
        help=f"simulated embedding engines serving {EMBED_MODEL} (default 1; 0 for none)",
    )
    p.add_argument(
        "--embedding-base-port",
        type=int,
        default=None,
        help="first embedding engine port (default: after the generation engines)",
    )
    return p


def main(argv: list[str]) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.engines < 1:
        p.error("--engines must be at least 1")
    if args.embedding_engines < 0:
        p.error("--embedding-engines must be at least 0")

    ports = list(range(args.sim_base_port, args.sim_base_port + args.engines))
    embed_base = args.embedding_base_port or args.sim_base_port + args.engines
    embed_ports = list(range(embed_base, embed_base + args.embedding_engines))
    all_ports = [*ports, *embed_ports, args.port]
    busy = [port for port in all_ports if not port_free("127.0.0.1", port)]
    if busy:
        print(
            f"fleet-proxy demo: port(s) {busy} already in use; "
            "choose others with --port / --sim-base-port / --embedding-base-port",
            file=sys.stderr,
        )
        return 2
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    embed_urls = [f"http://127.0.0.1:{port}" for port in embed_ports]
    overrides: dict[str, object] = {
        "host": args.host,
        "port": args.port,
        "backends": [*urls, *embed_urls],
    }
    if args.policy:
        overrides["policy"] = args.policy
    try:
        settings = load_settings(overrides)
    except ConfigError as e:
        print(f"fleet-proxy demo: {e}", file=sys.stderr)
        return 2

    sim_cmds = [
        [
            sys.executable, "-m", "proxy.serving.cli", "sim",
            "--engines", str(args.engines),
            "--base-port", str(args.sim_base_port),
            "--profile", args.profile,
            "--speed", str(args.speed),
        ]
    ]  # fmt: skip
    if embed_ports:
        sim_cmds.append(
            [
                sys.executable, "-m", "proxy.serving.cli", "sim",
                "--engines", str(args.embedding_engines),
                "--base-port", str(embed_base),
                "--profile", EMBED_PROFILE,
                "--model", EMBED_MODEL,
                "--speed", str(args.speed),
            ]
        )  # fmt: skip
    # SIGTERM and SIGHUP would end this process where it stands (uvicorn re-raises the
    # signal once it has shut down), leaving the simulator running on its ports: turned into
    # SystemExit, they unwind through the `finally` below that ends it.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit_on_signal)
    # Started from the main thread, before the proxy starts any other (preexec_fn runs
    # between fork and exec, where only the forking thread exists).
    children = [
        subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            preexec_fn=functools.partial(die_with_parent, os.getpid()),
        )
        for cmd in sim_cmds
    ]
    try:
        wait_healthy(urls, 60.0, children[0])
        if embed_urls:
            wait_healthy(embed_urls, 60.0, children[1])
        print(
            f"simulated fleet: {args.engines} engine(s), profile {args.profile}, "
            f"model {GENERATION_MODEL}, at {', '.join(urls)}",
            flush=True,
        )
        if embed_urls:
            print(
                f"embedding engine(s): {len(embed_urls)}, model {EMBED_MODEL}, "
                f"at {', '.join(embed_urls)}",
                flush=True,
            )
        return run_serve(settings, model=GENERATION_MODEL)
    except RuntimeError as e:
        print(f"fleet-proxy demo: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the proxy was up
        return 130
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
