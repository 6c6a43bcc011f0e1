"""`fleet-proxy sim` as a process: prints its URLs, serves, stops cleanly on SIGTERM."""

import asyncio
import signal
import sys
from pathlib import Path

import aiohttp

from tests.integration.simulator.conftest import post_json

ROOT = Path(__file__).resolve().parents[3]
LAUNCH = "import sys; from simulator.cli import main; sys.exit(main(sys.argv[1:]))"


async def test_cli_serves_engines_until_sigterm(http: aiohttp.ClientSession):
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LAUNCH,
        "--engines",
        "2",
        "--base-port",
        "0",
        "--speed",
        "10",
        "--profile",
        "cpu-tiny",
        "--model",
        "tiny-sim",
        "--role",
        "prefill,decode",
        "--fault-engines",
        "1",
        "--fault-error-rate",
        "1.0",
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        urls = [
            (await asyncio.wait_for(proc.stdout.readline(), 30)).decode().strip() for _ in range(2)
        ]
        assert all(u.startswith("http://127.0.0.1:") for u in urls) and urls[0] != urls[1]
        body = {"model": "tiny-sim", "prompt": "hi", "max_tokens": 3}
        status, ok = await post_json(http, urls[0] + "/v1/completions", body)
        assert status == 200 and ok["model"] == "tiny-sim"
        status, _ = await post_json(http, urls[1] + "/v1/completions", body)
        assert status == 500  # the fault flag applied to engine 1 only
        async with http.get(urls[0] + "/metrics") as r:
            assert 'block_size="128"' in await r.text()
        async with http.get(urls[1] + "/_sim/state") as r:
            assert (await r.json())["role"] == "decode"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(proc.wait(), 30)
    assert code == 0
