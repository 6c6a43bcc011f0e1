"""`fleet-proxy serve` and `fleet-proxy demo` as real processes on real loopback ports: the
"listening" line only once the port is bound, a port already taken refused in one line, and
a demo stopped by a signal taking its simulator with it, SIGKILL included (the kernel's
parent-death signal ends the simulator then)."""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import orjson
import pytest

from tests.support.polling import eventually_blocking
from tests.support.processes import alive, descendants, free_port, port_free

LISTENING = re.compile(r"fleet-proxy listening: base_url = http://127\.0\.0\.1:(\d+)/v1")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("FLEET_PROXY_")}


def models(port: int) -> list[str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
        return [m["id"] for m in orjson.loads(r.read())["data"]]


class Lines:
    """A process's output, line by line, waited for with a bound."""

    def __init__(self, stream: IO[str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: re.Pattern[str], timeout: float) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                break
            self.seen.append(line)
            if found := pattern.search(line):
                return found
        raise AssertionError(f"no line matching {pattern.pattern!r}; output: {self.seen}")


@contextlib.contextmanager
def started(args: list[str], log: Path) -> Iterator[tuple[subprocess.Popen[str], Lines]]:
    with log.open("w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.serving.cli", *args],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env=clean_env(),
        )
        assert proc.stdout is not None
        try:
            yield proc, Lines(proc.stdout)
        finally:
            if proc.poll() is None:
                # A test that failed early: its children too, not only the process.
                for pid in [*descendants(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=30)


@pytest.mark.slow
def test_serve_says_listening_once_the_port_accepts(tmp_path: Path) -> None:
    # Port 0: the line must name the port the kernel chose, which exists only once bound.
    with started(["serve", "--port", "0"], tmp_path / "serve.log") as (proc, out):
        port = int(out.wait_for(LISTENING, timeout=60).group(1))
        assert port != 0
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


@pytest.mark.slow
def test_serve_on_a_taken_port_says_so_without_listening(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "proxy.serving.cli", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            env=clean_env(),
            timeout=60,
            check=False,
        )
    assert done.returncode != 0
    assert "listening" not in done.stdout
    assert "address already in use" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"fleet-proxy: not serving: could not start on 127.0.0.1:{port} (the error above says why)"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=["SIGTERM", "SIGINT", "SIGKILL"]
)
def test_a_stopped_demo_ends_its_simulator_and_frees_the_ports(
    sig: signal.Signals, tmp_path: Path
) -> None:
    proxy_port, sim_port, embed_port = free_port(), free_port(), free_port()
    args = [
        "demo", "--engines", "1", "--port", str(proxy_port), "--sim-base-port", str(sim_port),
        "--embedding-base-port", str(embed_port),
    ]  # fmt: skip
    with started(args, tmp_path / "demo.log") as (proc, out):
        assert int(out.wait_for(LISTENING, timeout=90).group(1)) == proxy_port
        children = descendants(proc.pid)
        assert len(children) >= 2, "the demo runs its two simulators as child processes"
        eventually_blocking(
            lambda: sorted(models(proxy_port)) == ["sim-embed", "sim-llama-8b"],
            15,
            "the demo's models listed",
            0.05,
        )

        proc.send_signal(sig)
        proc.wait(timeout=30)
        try:
            eventually_blocking(
                lambda: not any(alive(pid) for pid in children),
                15,
                f"the demo's child processes {sorted(children)} ended",
                0.05,
            )
            eventually_blocking(
                lambda: all(port_free(p) for p in (proxy_port, sim_port, embed_port)),
                15,
                "the three ports free",
                0.05,
            )
        finally:
            for pid in children:
                if alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


REPO = Path(__file__).resolve().parents[2]

# Runs a script as its own process would, with the named modules unimportable (as when the
# optional dependency that provides them is not installed).
WITHOUT_MODULES = """
import runpy, sys
missing, script, *args = sys.argv[1:]
for name in missing.split(","):
    sys.modules[name] = None  # import raises ImportError
sys.argv = [script, *args]
sys.path.insert(0, str(__import__("pathlib").Path(script).parent))
runpy.run_path(script, run_name="__main__")
"""


def one_line_failure(args: list[str], timeout: float = 60) -> str:
    """Runs a command that must fail at once: non-zero, no traceback, one line on stderr."""
    done = subprocess.run(
        args, capture_output=True, text=True, env=clean_env(), timeout=timeout, check=False
    )
    assert done.returncode != 0, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "proxy.serving.cli", *args]


def test_sim_on_a_taken_port_says_so_in_one_line() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_failure(cli("sim", "--engines", "1", "--base-port", str(port)))
    assert line.startswith("fleet-proxy sim: cannot listen: ")
    assert f"('127.0.0.1', {port})" in line and "address already in use" in line
    assert line.endswith("pick other ports with --base-port, or --base-port 0 for any free ones")


def test_plan_without_a_proxy_says_so_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    line = one_line_failure(
        cli("plan", "--proxy", url, "--state-file", str(tmp_path / "state.json"))
    )
    assert line == (
        f"fleet-proxy: cannot reach the proxy at {url} (ConnectError: All connection attempts "
        "failed): start it first (`fleet-proxy serve`) or point --proxy at it"
    )


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("bench_planner.py", "bench_planner.py: the timeline plot needs matplotlib"),
        ("compare_peers.py", "compare_peers.py: the CDF plots needs matplotlib"),
    ],
)
def test_a_plotting_benchmark_without_matplotlib_says_so_before_it_starts(
    script: str, says: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    script_path = str(REPO / "scripts" / script)
    command = [sys.executable, "-c", WITHOUT_MODULES, "matplotlib", script_path]
    line = one_line_failure([*command, "--out", str(out)])
    assert line == f"{says}, not installed here: pip install -e '.[plots]'"
    assert not (out / "logs").exists()  # refused before any run started


def test_proxy_overhead_with_vllm_router_missing_says_so_in_one_line(tmp_path: Path) -> None:
    script = REPO / "scripts" / "perf" / "bench_proxy_overhead.py"
    beside = Path(sys.executable).parent / "vllm-router"
    if shutil.which("vllm-router") or beside.is_file():
        pytest.skip("vllm-router is installed here")
    line = one_line_failure(
        [sys.executable, str(script), "--vllm-router", "--out", str(tmp_path / "out")]
    )
    assert line.startswith("bench_proxy_overhead.py: --vllm-router needs the vllm-router ")
    assert line.endswith("pip install vllm-router, or leave --vllm-router out")


@pytest.mark.slow
def test_a_dead_backend_is_logged_unhealthy_with_its_reason(tmp_path: Path) -> None:
    dead = free_port()
    log = tmp_path / "serve.log"
    with started(["serve", "--port", "0", "--backend", f"http://127.0.0.1:{dead}"], log) as (
        proc,
        out,
    ):
        out.wait_for(LISTENING, timeout=60)
        said = re.compile(rf"backend 127\.0\.0\.1:{dead} is now unhealthy: (.*)")
        found = eventually_blocking(
            lambda: said.search(log.read_text()), 30, "the unhealthy line in the log", 0.1
        )
        assert found is not None
        assert found.group(1) == (
            "/health failed: ConnectError: All connection attempts failed (connection refused)"
        )
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
