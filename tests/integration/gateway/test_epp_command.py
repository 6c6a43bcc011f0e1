"""`fleet-proxy epp` as a process: it scrapes its engines, exports the Inference Extension's
pool metrics, answers ext_proc, and ends cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from simulator.fleet import start_fleet
from tests.integration.gateway.test_ext_proc_stream import pick_once
from tests.support.polling import eventually
from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[3]
MODEL = "sim-llama-8b"

pytestmark = pytest.mark.slow


def start_epp(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_PROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    env["FLEET_PROXY_SCRAPE_INTERVAL"] = "0.1"
    return subprocess.Popen(
        [sys.executable, "-m", "proxy.serving.cli", "epp", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


async def test_the_epp_command_serves_ext_proc_and_pool_metrics_then_stops() -> None:
    async with await start_fleet(2, speed=20.0) as fleet:
        port, metrics_port = free_port(), free_port()
        args = ["--port", str(port), "--metrics-port", str(metrics_port), "--policy", "lmetric"]
        for url in fleet.urls:
            args += ["--backend", url]
        proc = start_epp(*args)
        try:
            async with httpx.AsyncClient(timeout=2) as client:

                async def pool_ready() -> bool:
                    assert proc.poll() is None, proc.communicate()[0]
                    try:
                        text = (await client.get(f"http://127.0.0.1:{metrics_port}/")).text
                    except httpx.TransportError:
                        return False
                    return f'inference_pool_ready_pods{{name="{MODEL}"}} 2.0' in text

                await eventually(pool_ready, within=30, what="the pool's engines ready")
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
            answer = await pick_once(port, body)
            picked = (
                answer.dynamic_metadata.fields["envoy.lb"]
                .struct_value.fields["x-gateway-destination-endpoint"]
                .string_value
            )
            assert picked in {u.removeprefix("http://") for u in fleet.urls}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
        assert proc.returncode == 0, out
        assert "endpoint picker listening" in out
