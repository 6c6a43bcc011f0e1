"""LoRA affinity through the proxy, configured by an llm-d EndpointPickerConfig in the config
file, in front of two simulated engines serving the same adapters with one LoRA slot each:
a request for an adapter goes to the engine where that adapter is running."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import yaml

from proxy.settings import load_settings
from simulator.fleet import start_fleet
from simulator.lora import LoraConfig
from simulator.tokenizer import Tokenizer
from tests.support.polling import eventually
from tests.support.servers import running_proxy

EPP = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: lora-affinity-scorer
- type: queue-scorer
- type: max-score-picker
- type: single-profile-handler
- type: openai-parser
parser:
  pluginRef: openai-parser
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: lora-affinity-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
  - pluginRef: max-score-picker
"""


@contextlib.asynccontextmanager
async def running_adapter(url: str, adapter: str) -> AsyncIterator[None]:
    """A long stream for `adapter` on one engine, directly: the adapter runs there until the
    stream is closed (closing it aborts the request)."""
    started = asyncio.Event()

    async def stream() -> None:
        async with (
            httpx.AsyncClient(base_url=url, timeout=120) as c,
            c.stream(
                "POST",
                "/v1/completions",
                json={
                    "model": adapter,
                    "prompt": "write forever",
                    "max_tokens": 20000,
                    "ignore_eos": True,
                    "stream": True,
                },
            ) as r,
        ):
            async for _ in r.aiter_bytes():
                started.set()

    task = asyncio.create_task(stream())
    try:
        await asyncio.wait_for(started.wait(), 30)
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_requests_go_where_their_adapter_runs(tmp_path: Path) -> None:
    lora = LoraConfig({"sql-lora": "/adapters/sql", "chat-lora": "/adapters/chat"}, max_loras=1)
    async with await start_fleet(2, speed=1.0, tokenizer=Tokenizer(), lora=lora) as fleet:
        config = {
            "backends": fleet.urls,
            "routing": yaml.safe_load(EPP),
            "scrape_interval": 0.05,
            "health_interval": 0.1,
            "stale_after": 2.0,
            "debug_receipts": True,
        }
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(config))
        sql_host, chat_host = (u.removeprefix("http://") for u in fleet.urls)
        async with (
            running_adapter(fleet.urls[0], "sql-lora"),
            running_adapter(fleet.urls[1], "chat-lora"),
            running_proxy(load_settings(config_file=path)) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=60) as client,
        ):

            async def adapters_seen() -> bool:
                running = {
                    b["id"]: (b["metrics"] or {}).get("lora_running")
                    for b in (await client.get("/admin/backends")).json()
                }
                return running == {sql_host: ["sql-lora"], chat_host: ["chat-lora"]}

            await eventually(
                adapters_seen, within=30, what="each engine's adapter seen running", every=0.02
            )

            for adapter, home, other in (
                ("sql-lora", sql_host, chat_host),
                ("chat-lora", chat_host, sql_host),
            ):
                for i in range(3):
                    r = await client.post(
                        "/v1/completions",
                        json={"model": adapter, "prompt": f"query {i}", "max_tokens": 2},
                        headers={"x-fleet-debug": "1"},
                    )
                    assert r.status_code == 200, r.text
                    assert r.json()["model"] == adapter
                    assert r.headers["x-fleet-backend"] == home
                    scores = json.loads(r.headers["x-fleet-decision"])["scores"]
                    # running there: 1; the only slot elsewhere holds the other adapter: 0
                    assert scores[home]["lora-affinity-scorer"] == 1.0
                    assert scores[other]["lora-affinity-scorer"] == 0.0
