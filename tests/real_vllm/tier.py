"""The real-vLLM tier as tests see it: engines from the state file, proxies in front of them.

The engines are started by scripts/real_vllm/engines.py (which writes the state file); the
tests only read that file, so one set of engines serves the whole session and a missing tier
is a clear skip rather than a 5-minute install inside pytest.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.polling import holds_within_blocking

REPO = Path(__file__).resolve().parents[2]
CACHE = Path.home() / ".cache" / "fleet-proxy" / "real-vllm"
HOW_TO = (
    "prepare and start it with `bash scripts/real_vllm/prepare.sh && "
    "python3 scripts/real_vllm/engines.py start --kv-events`, or run the whole tier with "
    "`bash scripts/real_vllm/run_tier.sh`"
)

HOW_TO_KV_EVENTS = (
    "start the engines with KV-cache events: `python3 scripts/real_vllm/engines.py start "
    "--kv-events` (run_tier.sh does)"
)

HOW_TO_PD = (
    "prepare and start it with `bash scripts/real_vllm/prepare.sh --with-nixl && "
    "python3 scripts/real_vllm/engines.py start --pd-nixl`, or run the tier with "
    "`bash scripts/real_vllm/run_tier.sh --with-pd`"
)


HOW_TO_POOLING = (
    "start an embedding engine beside the ordinary pair with `python3 "
    "scripts/real_vllm/engines.py start --count 1 --pooling --served-model-name tiny-embed "
    "--state ~/.cache/fleet-proxy/real-vllm/pooling-state.json`, or run the whole tier with "
    "`bash scripts/real_vllm/run_tier.sh`"
)

_REQUIRED_ENV = {
    "pd_nixl": "FLEET_REAL_VLLM_PD_REQUIRED",
    "pooling": "FLEET_REAL_VLLM_POOLING_REQUIRED",
}
_HOW_TO = {"pd_nixl": HOW_TO_PD, "pooling": HOW_TO_POOLING}


def required_env(mode: str) -> str:
    """The variable that makes a missing tier of this mode a failure (run_tier.sh sets it)."""
    return _REQUIRED_ENV.get(mode, "FLEET_REAL_VLLM_REQUIRED")


def how_to(mode: str) -> str:
    return _HOW_TO.get(mode, HOW_TO)


def unavailable(reason: str, mode: str) -> None:
    """Skip, or fail where the tier is required."""
    if os.environ.get(required_env(mode)) == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


@dataclass(frozen=True)
class Engine:
    name: str
    role: str
    url: str
    pid: int
    log: str
    nixl_side_channel_port: int | None = None
    # Started with `engines.py start --kv-events`: vLLM's KV-event PUB and replay sockets.
    kv_events_endpoint: str | None = None
    kv_events_replay_endpoint: str | None = None

    @property
    def backend_id(self) -> str:
        """The proxy's default backend id: host:port of the URL."""
        return self.url.removeprefix("http://")

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = Path(self.log).read_text(errors="replace")
        except OSError as e:
            return f"({self.name}: no log: {e})"
        return f"--- {self.name} ({self.url}) ---\n" + "\n".join(text.splitlines()[-lines:])


@dataclass(frozen=True)
class Tier:
    engines: tuple[Engine, ...]
    model: str
    model_dir: Path
    max_model_len: int
    kv_events_topic: str | None = None  # None: the engines publish no KV-cache events
    pooling: str | None = None  # "embed" / "classify": the model runs as a pooling model

    def by_backend_id(self, backend_id: str) -> Engine:
        for e in self.engines:
            if e.backend_id == backend_id:
                return e
        raise KeyError(f"no engine with backend id {backend_id!r} in {self.engines}")

    def other_than(self, engine: Engine) -> Engine:
        return next(e for e in self.engines if e != engine)


def load_tier(state_file: Path, mode: str) -> Tier:
    """`mode`: "aggregated" (generation engines), "pd_nixl" or "pooling"."""
    if not state_file.exists():
        unavailable(
            f"real-vLLM tier ({mode}) not running: no state file {state_file}; {how_to(mode)}",
            mode,
        )
    raw = json.loads(state_file.read_text())
    # engines.py records pooling engines as an "aggregated" tier with the pooling task.
    described = "pooling" if raw.get("pooling") else raw.get("mode")
    if described != mode:
        unavailable(f"{state_file} describes a {described!r} tier, these tests need {mode!r}", mode)
    engines = tuple(
        Engine(
            e["name"],
            e["role"],
            e["url"],
            e["pid"],
            e["log"],
            e.get("nixl_side_channel_port"),
            e.get("kv_events_endpoint"),
            e.get("kv_events_replay_endpoint"),
        )
        for e in raw["engines"]
    )
    for e in engines:
        try:
            ok = httpx.get(f"{e.url}/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            ok = False
        if not ok:
            unavailable(
                f"engine {e.name} at {e.url} does not answer /health (log: {e.log}); "
                f"{how_to(mode)}",
                mode,
            )
    return Tier(
        engines,
        raw["served_model_name"],
        Path(raw["model_dir"]),
        raw["max_model_len"],
        raw.get("kv_events_topic"),
        raw.get("pooling"),
    )


def state_file(env: str, default_name: str) -> Path:
    return Path(os.environ.get(env, CACHE / default_name))


# --- engine /metrics, parsed independently of fleet/vllm_metrics.py (the code under test) ---


def engine_samples(url: str) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def engine_metric(url: str, name: str, **labels: str) -> float:
    """Sum of a sample over the `engine` (and any unnamed) labels, e.g. num_requests_running."""
    return sum(
        value
        for sample, sample_labels, value in engine_samples(url)
        if sample == name and all(sample_labels.get(k) == v for k, v in labels.items())
    )


def cache_config(url: str) -> dict[str, str]:
    for name, labels, _ in engine_samples(url):
        if name == "vllm:cache_config_info":
            return labels
    raise AssertionError(f"{url}/metrics has no vllm:cache_config_info")


# --- the proxy under test, as a subprocess on a free port ---


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fleet_proxy_command() -> list[str]:
    script = Path(sys.executable).with_name("fleet-proxy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "proxy.serving.cli"]


@dataclass
class Proxy:
    url: str
    policy: str
    process: subprocess.Popen[bytes]
    log: Path

    def backends(self) -> list[dict[str, Any]]:
        resp = httpx.get(f"{self.url}/admin/backends", timeout=10)
        resp.raise_for_status()
        views: list[dict[str, Any]] = resp.json()
        return views

    def backend(self, backend_id: str) -> dict[str, Any]:
        return next(b for b in self.backends() if b["id"] == backend_id)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def start_proxy(
    tier: Tier, policy: str, log_dir: Path, timeout: float = 60.0, config: Path | None = None
) -> Proxy:
    """`fleet-proxy serve` in front of the tier; with `config`, backends and routing come
    from that YAML file instead of --backend flags and `policy`."""
    port = free_port()
    cmd = [*fleet_proxy_command(), "serve", "--port", str(port)]
    if config is not None:
        cmd += ["--config", str(config)]
    else:
        cmd += ["--policy", policy]
        for e in tier.engines:
            cmd += ["--backend", e.url]
    log = log_dir / f"proxy-{policy}-{port}.log"
    # These CPU engines sometimes hold their output for seconds, and on 2 loaded cores their
    # API server may not accept a connection for as long: a stall or a slow connect here is
    # not a dead engine, and a move or retry the test did not ask for would change what it
    # observes. (A killed engine refuses connections at once.) A decoding engine saturates
    # both cores, and its /metrics then takes seconds to render: a 1 s scrape timeout would
    # leave the proxy's view stale for as long as the engine is busy.
    env = {
        **os.environ,
        "FLEET_PROXY_STALL_TIMEOUT": "60",
        "FLEET_PROXY_CONNECT_TIMEOUT": "30",
        "FLEET_PROXY_SCRAPE_TIMEOUT": "15",
    }
    with log.open("wb") as out:
        process = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, env=env)
    proxy = Proxy(f"http://127.0.0.1:{port}", policy, process, log)

    def all_routable() -> bool:
        if process.poll() is not None:
            return True  # reported below
        try:
            if httpx.get(f"{proxy.url}/ready", timeout=2).status_code != 200:
                return False
            views = proxy.backends()
        except httpx.HTTPError:
            return False
        return len(views) == len(tier.engines) and all(v["routable"] for v in views)

    ready = holds_within_blocking(all_routable, timeout, every=0.2)
    if process.poll() is not None or not ready:
        proxy.stop()
        pytest.fail(f"`{' '.join(cmd)}` did not become ready:\n{proxy.log_tail()}", pytrace=False)
    return proxy
