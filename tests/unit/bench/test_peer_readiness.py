"""A benchmark run starts once its router has served a completion: a fake router on a real
loopback port that answers 503 `no_available_workers` (sglang-router registering its workers)
before it serves, as the peer routers do."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


readiness = load("peer_readiness")


class FakeRouter:
    """Refuses the first `refusals` completions with `status`, then serves; lists its model
    as `unknown`, as sglang-router does in front of vLLM."""

    def __init__(self, refusals: int, status: int = 503) -> None:
        self.refusals = refusals
        self.status = status
        self.bodies: list[dict[str, Any]] = []
        self.paths: list[str] = []
        router = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                router.bodies.append(body)
                router.paths.append(self.path)
                if len(router.bodies) <= router.refusals:
                    self._answer(router.status, {"error": "no_available_workers"})
                else:
                    self._answer(200, {"choices": [{"text": "y"}], "model": body["model"]})

            def do_GET(self) -> None:
                self._answer(200, {"data": [{"id": "unknown"}]})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def serve() -> Iterator[Any]:
    started: list[FakeRouter] = []

    def start(refusals: int, status: int = 503) -> FakeRouter:
        router = FakeRouter(refusals, status)
        threading.Thread(target=router.server.serve_forever, daemon=True).start()
        started.append(router)
        return router

    yield start
    for router in started:
        router.server.shutdown()
        router.server.server_close()


def test_the_wait_retries_no_available_workers_until_a_completion_is_served(serve: Any) -> None:
    router = serve(refusals=3)
    served = readiness.wait_until_serving(router.url, "sim-llama-8b", interval_s=0.01)
    assert served.attempts == 4
    assert served.refusals == ('503 {"error": "no_available_workers"}',)
    # Every try names the fleet's model, not the router's `unknown`, and asks for one token.
    assert [b["model"] for b in router.bodies] == ["sim-llama-8b"] * 4
    assert all(b["max_tokens"] == 1 and b["stream"] is False for b in router.bodies)
    assert set(router.paths) == {"/v1/chat/completions"}


def test_the_wait_uses_the_api_the_bench_will(serve: Any) -> None:
    router = serve(refusals=0)
    api = readiness.bench_api(["--workload", "chat", "--api", "completions"])
    assert readiness.wait_until_serving(router.url, "m", api, interval_s=0.01).attempts == 1
    assert router.paths == ["/v1/completions"] and "prompt" in router.bodies[0]
    assert readiness.bench_api(["--workload", "chat"]) == "chat"


def test_a_router_that_never_serves_ends_the_wait_with_what_it_said(serve: Any) -> None:
    router = serve(refusals=10**6)
    with pytest.raises(readiness.NotServing) as ended:
        readiness.wait_until_serving(router.url, "m", timeout_s=0.3, interval_s=0.05)
    assert "served no completion in 0 s" in str(ended.value)
    assert "no_available_workers" in str(ended.value)
    assert len(router.bodies) >= 2  # it did retry


def test_a_refusal_that_will_not_pass_ends_the_wait_at_once(serve: Any) -> None:
    router = serve(refusals=10**6, status=404)
    with pytest.raises(readiness.NotServing, match="refused a completion: 404"):
        readiness.wait_until_serving(router.url, "m", timeout_s=60, interval_s=0.01)
    assert len(router.bodies) == 1


def test_a_router_that_exits_ends_the_wait(serve: Any) -> None:
    router = serve(refusals=10**6)
    with pytest.raises(readiness.NotServing, match="exited"):
        readiness.wait_until_serving(router.url, "m", alive=lambda: False, timeout_s=60)


def test_nothing_listening_is_retried_until_the_limit() -> None:
    with pytest.raises(readiness.NotServing, match="no answer"):
        readiness.wait_until_serving("http://127.0.0.1:9", "m", timeout_s=0.2, interval_s=0.05)


def test_a_peer_router_comes_from_the_peers_venv_first(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "sglang-router"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert readiness.router_executable("sglang-router", tmp_path) == str(exe)
    assert readiness.router_executable("no-such-router-here", tmp_path) is None
