"""Start, inspect and stop the real vLLM engines of the test tier.

    python scripts/real_vllm/engines.py start [--count N] [--pd-nixl] [--kv-events]
                                              [--pooling [classify]] [--served-model-name NAME]
                                              [--state PATH]
    python scripts/real_vllm/engines.py status [--state PATH]
    python scripts/real_vllm/engines.py stop [--state PATH]

Standard library only, so any Python runs it. `start` launches each engine in its own
process group on a free loopback port, waits until every /health answers 200 and writes a
state file (URLs, PIDs, log paths) that the tests and the golden capture read. `stop` ends
exactly the process groups recorded there, by PID. Paths come from the same environment
variables as prepare.sh (FLEET_VLLM_VENV, FLEET_VLLM_MODEL_DIR) plus FLEET_VLLM_STATE;
--state names another state file, so a pooling engine can run beside the ordinary pair (the
tier's pooling tests read pooling-state.json, see tests/real_vllm/tier.py).

With --kv-events each engine also publishes its KV-cache events: vLLM binds a ZMQ PUB socket
and a replay ROUTER socket on free ports (`tcp://*:PORT`, so vLLM binds rather than
connects), and the state file records where a subscriber connects (kv_events_endpoint,
kv_events_replay_endpoint, kv_events_topic). Those engines also run with
VLLM_SERVER_DEV_MODE=1, for POST /reset_prefix_cache.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

# The repository root, for proxy.backends.kv_transfer (standard library only, like this script).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from proxy.backends.kv_transfer import remote_decode_params

SERVED_MODEL_NAME = "tiny"
MAX_MODEL_LEN = 4096
CACHE = Path.home() / ".cache" / "fleet-proxy"
NIXL_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}'
KV_EVENTS_TOPIC = "kv"


class TierError(RuntimeError):
    """A failure the operator can act on; the message says what went wrong."""


class PortTaken(TierError):
    """An engine could not bind a port that was free when chosen; starting again may work."""


@dataclass
class Engine:
    name: str
    role: str  # "both" for an ordinary engine, "prefill" / "decode" with NixlConnector
    port: int
    url: str
    pid: int
    log: str
    nixl_side_channel_port: int | None = None
    # With --kv-events: where a subscriber connects (vLLM binds tcp://*:PORT).
    kv_events_endpoint: str | None = None  # ZMQ PUB: (topic, 8-byte seq, msgpack batch)
    kv_events_replay_endpoint: str | None = None  # ZMQ ROUTER: replay from a sequence number


@dataclass
class TierState:
    venv: str
    model_dir: str
    served_model_name: str
    max_model_len: int
    mode: str  # "aggregated" or "pd_nixl"
    omp_threads: int = 1
    engines: list[Engine] = field(default_factory=list)
    kv_events_topic: str | None = None  # None: the engines publish no KV-cache events
    num_gpu_blocks: int | None = None  # --num-gpu-blocks-override, when set
    pooling: str | None = None  # "embed" or "classify": the model as a pooling model


@dataclass(frozen=True)
class Options:
    """How `start` configures each engine beyond the fixed tier settings."""

    omp_threads: int = 1
    kv_events: bool = False
    max_model_len: int = MAX_MODEL_LEN
    num_gpu_blocks: int | None = None  # a small KV cache makes a few requests evict blocks
    # The model as a pooling model (`embed` or `classify`): pooling routes, no generation.
    pooling: str | None = None
    served_model_name: str = SERVED_MODEL_NAME


def venv_dir() -> Path:
    return Path(os.environ.get("FLEET_VLLM_VENV", CACHE / "vllm-venv"))


def model_dir() -> Path:
    return Path(os.environ.get("FLEET_VLLM_MODEL_DIR", CACHE / "tiny-llama"))


def state_path(pd_nixl: bool = False) -> Path:
    """Separate files for the two set-ups, so a P/D pair can run beside the ordinary pair."""
    if pd_nixl:
        return Path(os.environ.get("FLEET_VLLM_PD_STATE", CACHE / "real-vllm" / "pd-state.json"))
    return Path(os.environ.get("FLEET_VLLM_STATE", CACHE / "real-vllm" / "state.json"))


def read_state(path: Path) -> TierState | None:
    if not path.exists():
        return None
    raw = json.loads(path.read_text())
    engines = [Engine(**e) for e in raw.pop("engines")]
    return TierState(engines=engines, **raw)


def write_state(path: Path, state: TierState) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n")
    tmp.replace(path)


# Below Linux's ephemeral range (32768-60999): ports the OS hands out for port-0 binds (vLLM's
# own ZMQ sockets, other tests) then cannot take ours between our check and the engine's bind.
PORT_RANGE = (20000, 32000)


def free_port(rng: random.Random | None = None, avoid: tuple[int, ...] = ()) -> int:
    rng = rng or random.Random()
    for _ in range(200):
        port = rng.randrange(*PORT_RANGE)
        if port in avoid:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise TierError(f"no free loopback port in {PORT_RANGE}")


def ensure_port_free(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise TierError(f"port {port} on 127.0.0.1 is in use ({exc.strerror})") from exc


def is_our_engine(pid: int) -> bool:
    """True when pid is alive and still a vLLM server (guards against PID reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"vllm.entrypoints" in cmdline


def child_exited(pid: int) -> bool:
    """Whether an engine we launched has exited. Reaps it; /proc/PID/cmdline is no use here:
    between fork and exec it still shows this script."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:  # not our child (another `start`): judge by its command line
        return not is_our_engine(pid)
    return done != 0


def log_tail(path: str, lines: int = 40) -> str:
    try:
        text = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:])


def engine_env(nixl_port: int | None, omp_threads: int, dev_mode: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        # vLLM would start 2 OpenMP threads per engine here; two engines spinning on 2 shared
        # cores then ran ~8x slower when both were busy (measured: 100 tokens each in 32-36 s
        # instead of 3-5.5 s with one thread each).
        OMP_NUM_THREADS=str(omp_threads),
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
    )
    if nixl_port is not None:
        env.update(
            VLLM_NIXL_SIDE_CHANNEL_PORT=str(nixl_port), VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1"
        )
    if dev_mode:
        env["VLLM_SERVER_DEV_MODE"] = "1"  # POST /reset_prefix_cache (and other dev routes)
    return env


def kv_events_config(pub_port: int, replay_port: int) -> str:
    """vLLM binds only endpoints with a wildcard host (or ipc/inproc): `tcp://127.0.0.1:PORT`
    would make its PUB socket *connect* there, and a subscriber connecting to the same
    address would never meet it. (Data-parallel rank r adds r to both ports.)"""
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{pub_port}",
            "replay_endpoint": f"tcp://*:{replay_port}",
            "topic": KV_EVENTS_TOPIC,
        }
    )


def engine_command(
    venv: Path,
    model: Path,
    port: int,
    nixl: bool,
    kv_event_ports: tuple[int, int] | None = None,
    max_model_len: int = MAX_MODEL_LEN,
    num_gpu_blocks: int | None = None,
    pooling: str | None = None,
    served_model_name: str = SERVED_MODEL_NAME,
) -> list[str]:
    cmd = [
        str(venv / "bin" / "python"),
        "-m",
        "vllm.entrypoints.openai.api_server",  # the `vllm` script fails: the dist is vllm-cpu
        "--model",
        str(model),
        "--served-model-name",
        served_model_name,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        "--enable-prefix-caching",
        "--enforce-eager",
        "--dtype",
        "float32",
    ]
    if nixl:
        cmd += ["--kv-transfer-config", NIXL_CONFIG]
    if kv_event_ports is not None:
        cmd += ["--kv-events-config", kv_events_config(*kv_event_ports)]
    if num_gpu_blocks is not None:
        cmd += ["--num-gpu-blocks-override", str(num_gpu_blocks)]
    if pooling is not None:
        # The tiny Llama adapted to a pooling task: vLLM then registers that task's routes
        # (embed: /v1/embeddings, /pooling, /score, /rerank; classify: /classify, /pooling)
        # instead of the generation ones.
        cmd += ["--runner", "pooling", "--convert", pooling]
    return cmd


def launch(
    venv: Path, model: Path, name: str, role: str, port: int, log_dir: Path, options: Options
) -> Engine:
    ensure_port_free(port)
    taken: tuple[int, ...] = (port,)
    nixl_port = None
    if role in ("prefill", "decode"):
        nixl_port = free_port(avoid=taken)
        taken += (nixl_port,)
    kv_ports = None
    if options.kv_events:
        pub = free_port(avoid=taken)
        kv_ports = (pub, free_port(avoid=(*taken, pub)))
    for extra in (nixl_port, *(kv_ports or ())):
        if extra is not None:
            ensure_port_free(extra)
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            engine_command(
                venv,
                model,
                port,
                nixl_port is not None,
                kv_ports,
                options.max_model_len,
                options.num_gpu_blocks,
                options.pooling,
                options.served_model_name,
            ),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=engine_env(nixl_port, options.omp_threads, dev_mode=options.kv_events),
            start_new_session=True,  # its own process group, so stop ends the engine core too
        )
    engine = Engine(name, role, port, f"http://127.0.0.1:{port}", proc.pid, str(log), nixl_port)
    if kv_ports is not None:
        engine.kv_events_endpoint = f"tcp://127.0.0.1:{kv_ports[0]}"
        engine.kv_events_replay_endpoint = f"tcp://127.0.0.1:{kv_ports[1]}"
    return engine


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


def died_reason(engine: Engine) -> str:
    tail = log_tail(engine.log)
    hint = ""
    if "Address already in use" in tail:
        hint = f" (port {engine.port} or one of its other ports was taken by another process)"
    elif "No module named 'vllm'" in tail:
        hint = " (vLLM is not installed in the venv: run scripts/real_vllm/prepare.sh)"
    elif "nixl" in tail.lower() and "No module named" in tail:
        hint = " (NIXL is missing: run scripts/real_vllm/prepare.sh --with-nixl)"
    head = f"engine {engine.name} (pid {engine.pid}) died{hint}"
    return f"{head}; last log lines of {engine.log}:\n{tail}"


def wait_ready(engines: list[Engine], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(engines)
    while pending:
        for engine in list(pending):
            if "Address already in use" in log_tail(engine.log, 200):
                # vLLM may keep the process alive after a failed bind: do not wait it out.
                raise PortTaken(died_reason(engine))
            if child_exited(engine.pid):
                raise TierError(died_reason(engine))
            if healthy(engine.url):
                check_kv_event_sources(engine)
                print(f"[real-vllm] {engine.name} ready at {engine.url}", file=sys.stderr)
                pending.remove(engine)
        if pending and time.monotonic() > deadline:
            names = ", ".join(e.name for e in pending)
            tails = "\n".join(f"--- {e.log}\n{log_tail(e.log, 15)}" for e in pending)
            raise TierError(f"not ready after {timeout:.0f} s: {names}\n{tails}")
        if pending:
            time.sleep(1.0)


def check_kv_event_sources(engine: Engine) -> None:
    """An engine started with KV events must report the publisher it bound (GET
    /kv_event_sources: one config per data-parallel rank)."""
    if engine.kv_events_endpoint is None:
        return
    try:
        with urllib.request.urlopen(f"{engine.url}/kv_event_sources", timeout=10) as resp:
            sources = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise TierError(f"{engine.name}: GET /kv_event_sources failed: {exc}") from exc
    port = engine.kv_events_endpoint.rsplit(":", 1)[1]
    endpoint = (sources.get("0") or {}).get("endpoint")
    if endpoint != f"tcp://*:{port}":
        raise TierError(
            f"{engine.name}: /kv_event_sources reports {sources!r}, expected a publisher bound "
            f"on tcp://*:{port}; log {engine.log}"
        )


def post_json(url: str, body: dict[str, object], timeout: float) -> dict[str, object]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data: dict[str, object] = json.loads(resp.read())
        return data


def warm_kv_path(prefill: Engine, decode: Engine, model: str, tries: int = 3) -> None:
    """One prefill->decode exchange, so the NIXL handshake is done before tests run.

    The decode engine gives the prefill side's handshake 5 s; on 2 loaded cores the first
    one can miss that and fails its request, the next one succeeds.
    """
    body: dict[str, object] = {"model": model, "prompt": [20] * 200, "max_tokens": 2}
    remote_decode = remote_decode_params()
    last = ""
    for attempt in range(1, tries + 1):
        try:
            first = post_json(
                f"{prefill.url}/v1/completions",
                {**body, "max_tokens": 1, "kv_transfer_params": remote_decode},
                180,
            )
            params = first["kv_transfer_params"]
            post_json(f"{decode.url}/v1/completions", {**body, "kv_transfer_params": params}, 180)
            print(f"[real-vllm] NIXL KV path warm after {attempt} exchange(s)", file=sys.stderr)
            return
        except (urllib.error.URLError, OSError, KeyError) as exc:
            last = str(exc)
            time.sleep(2.0)
    raise TierError(
        f"prefill->decode KV transfer failed {tries} times (last: {last}); "
        f"decode log {decode.log}:\n{log_tail(decode.log)}"
    )


def group_members(pgid: int) -> list[int]:
    """PIDs in process group `pgid` (an engine's API server, engine core, worker, ...)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid:  # fields: state, ppid, pgrp, ...
            members.append(int(stat.parent.name))
    return members


def is_engine_group(pgid: int) -> bool:
    """Whether group `pgid` still holds vLLM processes: the server may be gone while its
    engine core lingers, and a reused PID must not be killed."""
    for pid in group_members(pgid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if b"vllm" in cmdline.lower():
            return True
    return False


def stop_engine(engine: Engine, launched_here: bool = False, grace: float = 20.0) -> None:
    """End the engine's process group. `launched_here`: we just started it, so its PID is
    surely ours even if it has not exec'ed vLLM yet."""
    pgid = engine.pid
    if not launched_here and not is_engine_group(pgid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pgid, os.WNOHANG)  # reap our own child, or it lingers as a zombie
        if not group_members(pgid):
            return
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, 0)


def start(
    count: int,
    pd_nixl: bool,
    timeout: float,
    options: Options,
    path: Path | None = None,
) -> TierState:
    """Start the engines and write the state file (`path`, default: by mode, from the
    environment)."""
    venv, model = venv_dir(), model_dir()
    path = path or state_path(pd_nixl)
    if not (venv / "bin" / "python").exists():
        raise TierError(f"no vLLM venv at {venv}: run scripts/real_vllm/prepare.sh first")
    if not (model / "fleet-proxy-recipe.json").exists():
        raise TierError(f"no tiny model at {model}: run scripts/real_vllm/prepare.sh first")
    if (
        pd_nixl
        and subprocess.run(
            [str(venv / "bin" / "python"), "-c", "import nixl._api"],
            capture_output=True,
            check=False,
        ).returncode
    ):
        raise TierError(
            f"NIXL is not installed in {venv}: run scripts/real_vllm/prepare.sh --with-nixl"
        )
    old = read_state(path)
    if old and any(is_engine_group(e.pid) for e in old.engines):
        raise TierError(f"engines from {path} still run: run `engines.py stop` first")
    for attempt in range(1, 4):
        try:
            return start_once(venv, model, path, count, pd_nixl, timeout, options)
        except PortTaken as exc:
            if attempt == 3:
                raise
            print(f"[real-vllm] a port was taken, starting again: {exc}", file=sys.stderr)
    raise AssertionError("unreachable")


def start_once(
    venv: Path, model: Path, path: Path, count: int, pd_nixl: bool, timeout: float, options: Options
) -> TierState:
    roles = ["prefill", "decode"] if pd_nixl else ["both"] * count
    log_dir = path.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    state = TierState(
        str(venv),
        str(model),
        options.served_model_name,
        options.max_model_len,
        "pd_nixl" if pd_nixl else "aggregated",
        omp_threads=options.omp_threads,
        kv_events_topic=KV_EVENTS_TOPIC if options.kv_events else None,
        num_gpu_blocks=options.num_gpu_blocks,
        pooling=options.pooling,
    )
    try:
        for i, role in enumerate(roles):
            # Distinct names keep distinct logs when tiers share a log directory.
            name = f"{role}-{i}" if role != "both" else f"{options.pooling or 'engine'}-{i}"
            state.engines.append(launch(venv, model, name, role, free_port(), log_dir, options))
            write_state(path, state)  # recorded at once, so `stop` works even if start fails
        wait_ready(state.engines, timeout)
        if pd_nixl:
            warm_kv_path(state.engines[0], state.engines[1], options.served_model_name)
    except BaseException:
        for engine in state.engines:
            stop_engine(engine, launched_here=True)
        path.unlink(missing_ok=True)
        raise
    return state


def stop(pd_nixl: bool, path: Path | None = None) -> int:
    path = path or state_path(pd_nixl)
    state = read_state(path)
    if state is None:
        print(f"[real-vllm] nothing to stop ({path} absent)", file=sys.stderr)
        return 0
    for engine in state.engines:
        stop_engine(engine)
        print(f"[real-vllm] stopped {engine.name} (pid {engine.pid})", file=sys.stderr)
    path.unlink(missing_ok=True)
    return 0


def status(pd_nixl: bool, path: Path | None = None) -> int:
    path = path or state_path(pd_nixl)
    state = read_state(path)
    if state is None:
        print(f"not running ({path} absent)")
        return 1
    ok = True
    for e in state.engines:
        alive, up = is_our_engine(e.pid), healthy(e.url)
        ok &= up
        events = ""
        if e.kv_events_endpoint:
            events = f" kv_events={e.kv_events_endpoint} replay={e.kv_events_replay_endpoint}"
        print(
            f"{e.name} role={e.role} url={e.url} pid={e.pid} alive={alive} healthy={up}"
            f"{events} log={e.log}"
        )
    return 0 if ok else 1


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_start = sub.add_parser("start", help="start engines and wait until ready")
    p_start.add_argument("--count", type=int, default=2, help="ordinary engines (default 2)")
    p_start.add_argument(
        "--pd-nixl", action="store_true", help="one prefill + one decode with NixlConnector"
    )
    p_start.add_argument(
        "--omp-threads",
        type=int,
        default=int(os.environ.get("FLEET_VLLM_OMP_THREADS", "1")),
        help="OpenMP threads per engine (default 1, env FLEET_VLLM_OMP_THREADS)",
    )
    p_start.add_argument(
        "--kv-events",
        action="store_true",
        help="publish KV-cache events (ZMQ PUB + replay on free ports, in the state file)",
    )
    p_start.add_argument(
        "--max-model-len", type=int, default=MAX_MODEL_LEN, help=f"default {MAX_MODEL_LEN}"
    )
    p_start.add_argument(
        "--num-gpu-blocks",
        type=int,
        help="KV-cache blocks per engine (--num-gpu-blocks-override; default: from memory)",
    )
    p_start.add_argument(
        "--pooling",
        nargs="?",
        const="embed",
        choices=("embed", "classify"),
        help="run the model as a pooling model: embed (the default) or classify",
    )
    p_start.add_argument(
        "--served-model-name",
        default=SERVED_MODEL_NAME,
        help=f"the model's name in requests (default {SERVED_MODEL_NAME!r})",
    )
    p_start.add_argument("--timeout", type=float, default=420.0, help="seconds to wait for /health")
    p_stop = sub.add_parser("stop", help="stop the engines recorded in the state file")
    p_status = sub.add_parser("status", help="print the engines and whether they answer /health")
    for p in (p_stop, p_status):
        p.add_argument("--pd-nixl", action="store_true", help="the prefill/decode pair's state")
    for p in (p_start, p_stop, p_status):
        p.add_argument(
            "--state",
            type=Path,
            help="the state file (default: FLEET_VLLM_STATE; FLEET_VLLM_PD_STATE with --pd-nixl)",
        )
    args = parser.parse_args(argv)
    try:
        if args.cmd == "start":
            options = Options(
                omp_threads=args.omp_threads,
                kv_events=args.kv_events,
                max_model_len=args.max_model_len,
                num_gpu_blocks=args.num_gpu_blocks,
                pooling=args.pooling,
                served_model_name=args.served_model_name,
            )
            state = start(args.count, args.pd_nixl, args.timeout, options, args.state)
            print(args.state or state_path(args.pd_nixl))
            return 0 if state.engines else 1
        if args.cmd == "stop":
            return stop(args.pd_nixl, args.state)
        return status(args.pd_nixl, args.state)
    except TierError as exc:
        print(f"[real-vllm] ERROR: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
