"""`fleet-proxy serve` loads what it uses: the Kubernetes client (kubernetes-asyncio, with
aiohttp), the planner's TensorBoard writer (tensorboardX, with numpy and protobuf) and ZeroMQ
(for engines' KV-cache events) stay out of a proxy that has none of pod discovery, the planner
or precise prefix routing configured; the first two are there, working, once configured.

Each case runs in a fresh interpreter: this one has long since imported all of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.support.tb_events import scalars

ROOT = Path(__file__).resolve().parents[3]
# What the two features bring; none of it is on the serve path without them.
KUBERNETES = ("kubernetes_asyncio", "aiohttp")
TENSORBOARD = ("tensorboardX", "numpy", "google.protobuf")
KV_EVENTS = ("zmq",)
# The endpoint picker's gRPC server and Envoy's protos: `fleet-proxy epp` only.
GATEWAY = ("grpc", "envoy")

# The app built as `fleet-proxy serve ARGS` builds it, short of serving; then, if asked, its
# start-up run and what the colocated planner's TensorBoard writer makes of one sample.
BUILD = textwrap.dedent(
    """
    import asyncio, json, sys
    from proxy.serving.app import create_app
    from proxy.serving.cli import build_settings, parse_line
    from proxy.serving.front_door import uvicorn_config

    HEAVY = {heavy!r}
    settings = build_settings(parse_line(sys.argv[1:]))
    app = create_app(settings)
    uvicorn_config(app, settings)
    report = {{"built": [m for m in HEAVY if m in sys.modules]}}
    state = app.control_app.state
    if state.planner is not None and state.planner.observers.tensorboard is not None:
        from planner.observe import Sample

        board = state.planner.observers.tensorboard
        board.on_sample(Sample(at=0.0, prefill_queue=0.5, decode_kv=0.25,
                               prefill_replicas=1, decode_replicas=1))
        board.close()
    if settings.discovery_kubernetes:
        async def started():
            async with app.control_app.router.lifespan_context(app.control_app):
                return type(state.discovery.source).__name__
        report["source"] = asyncio.run(started())
    report["started"] = [m for m in HEAVY if m in sys.modules]
    print(json.dumps(report))
    """
).format(heavy=KUBERNETES + TENSORBOARD + KV_EVENTS + GATEWAY)


def serve(*argv: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_PROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-c", BUILD, "serve", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_a_plain_proxy_loads_neither_the_kubernetes_client_nor_tensorboard_nor_grpc() -> None:
    report = serve("--backend", "http://127.0.0.1:1")
    assert report["built"] == [] and report["started"] == []


def test_the_planner_loads_its_kubernetes_client_and_tensorboard_writer_and_they_work(
    tmp_path: Path,
) -> None:
    report = serve(
        "--backend", "http://127.0.0.1:1",
        "--enable-planner",
        "--planner-environment", "kubernetes",
        "--planner-prefill-target", "deployment/pre",
        "--planner-decode-target", "deployment/dec",
        "--planner-served-model-name", "m",
        "--planner-state-file", str(tmp_path / "state.json"),
        "--planner-log-dir", str(tmp_path / "tb"),
    )  # fmt: skip
    assert set(report["built"]) == set(KUBERNETES + TENSORBOARD)
    assert scalars(tmp_path / "tb") == {
        "sample/prefill_queue": [(1, 0.5)],
        "sample/decode_kv": [(1, 0.25)],
    }


def test_the_planner_without_a_log_dir_or_kubernetes_loads_neither(tmp_path: Path) -> None:
    report = serve(
        "--backend", "http://127.0.0.1:1",
        "--enable-planner",
        "--planner-state-file", str(tmp_path / "state.json"),
    )  # fmt: skip
    assert report["built"] == []


def test_pod_discovery_starts_a_kubernetes_client(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        """apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: anonymous, user: {}}]
contexts: [{name: none, context: {cluster: none, user: anonymous}}]
current-context: none
"""
    )
    report = serve("--discovery-kubernetes", "--discovery-kubeconfig", str(kubeconfig))
    assert report["source"] == "KubernetesSource"
    assert set(KUBERNETES) <= set(report["started"])
    assert not set(TENSORBOARD) & set(report["started"])
