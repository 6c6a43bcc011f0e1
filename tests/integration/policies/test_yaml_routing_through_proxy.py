"""The YAML `routing:` section of the proxy's config file, end to end."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import yaml

from proxy.serving.app import create_app
from proxy.settings import load_settings
from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.servers import running_proxy

MODEL = "sim-llama-8b"

ROUTING = """
routing:
  plugins:
    - {type: label-selector-filter, name: gold, params: {match_labels: {tier: gold}}}
    - {type: prefix-cache-scorer, name: prefix}
    - {type: queue-depth-scorer, name: queue}
    - {type: max-score-picker, name: best, params: {seed: 3}}
  profiles:
    - name: default
      filters: [gold]
      scorers: [{plugin: prefix, weight: 3}, queue]
      picker: best
"""


async def test_config_file_routing_section_drives_the_proxy(tmp_path: Path) -> None:
    async with await start_fleet(3, speed=20.0, tokenizer=Tokenizer()) as fleet:
        config = yaml.safe_load(ROUTING)
        config["backends"] = [
            {"url": url, "labels": {"tier": "gold" if i == 1 else "bronze"}}
            for i, url in enumerate(fleet.urls)
        ]
        config.update(scrape_interval=0.05, health_interval=0.1, stale_after=1.0)
        path = tmp_path / "fleet.yaml"
        path.write_text(yaml.safe_dump(config))
        settings = load_settings(config_file=path)
        gold = fleet.urls[1].removeprefix("http://")
        async with (
            running_proxy(settings) as (url, _),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            for i in range(4):
                r = await client.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": f"hello {i} " * 50, "max_tokens": 2},
                    headers={"x-fleet-debug": "1"},
                )
                assert r.status_code == 200, r.text
                assert r.headers["x-fleet-backend"] == gold
            policy = (await client.get("/admin/policy")).json()
            assert policy["stats"]["decisions"] == 4


def test_bad_routing_section_stops_start_up() -> None:
    config = yaml.safe_load(ROUTING)["routing"]
    config["plugins"][1]["type"] = "prefix-scorer-typo"
    settings = load_settings({"backends": ["http://127.0.0.1:9"], "routing": config})
    with pytest.raises(ValueError, match="unknown plugin type 'prefix-scorer-typo'; known types"):
        create_app(settings)


def test_an_llmd_config_with_an_unknown_type_stops_start_up() -> None:
    config = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "queue-scorer"}, {"type": "active-request-scorer"}],
    }
    settings = load_settings({"backends": ["http://127.0.0.1:9"], "routing": config})
    with pytest.raises(
        ValueError,
        match="EndpointPickerConfig: plugin 'active-request-scorer' has type "
        "'active-request-scorer', which cannot be honoured; types honoured: ",
    ):
        create_app(settings)
