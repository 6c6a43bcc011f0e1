"""The selective P/D decider through the proxy, on simulated prefill and decode engines."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from fleet.types import Role
from simulator.fleet import start_fleet
from simulator.tokenizer import Tokenizer
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"
ROUTING = {
    "plugins": [
        {"type": "prefill-endpoints-filter", "name": "prefill-only"},
        {"type": "decode-endpoints-filter", "name": "decode-only"},
        {"type": "lmetric-picker", "name": "lmetric"},
        {
            "type": "disagg-profile-handler",
            "name": "pd",
            "params": {"decider": "selective", "uncached_threshold_tokens": 256},
        },
    ],
    "profiles": [
        {"name": "prefill", "filters": ["prefill-only"], "picker": "lmetric"},
        {"name": "decode", "filters": ["decode-only"], "picker": "lmetric"},
    ],
}


def counter(page: str, name: str, labels: dict[str, str]) -> float:
    for fam in text_string_to_metric_families(page):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


async def test_long_uncached_prompts_go_through_prefill_short_and_cached_ones_do_not() -> None:
    roles = [Role.PREFILL, Role.DECODE]
    async with await start_fleet(2, speed=20.0, tokenizer=Tokenizer(), role=roles) as fleet:
        backends = [{"url": u, "role": r.value} for u, r in zip(fleet.urls, roles, strict=True)]
        prefill_id, decode_id = (u.removeprefix("http://") for u in fleet.urls)
        async with (
            running_proxy(fast_settings(backends, routing=ROUTING, debug_receipts=True)) as (
                url,
                _,
            ),
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):

            async def ask(prompt: str) -> dict[str, object]:
                r = await client.post(
                    "/v1/completions",
                    json={"model": MODEL, "prompt": prompt, "max_tokens": 4},
                    headers={"x-fleet-debug": "1"},
                )
                assert r.status_code == 200, r.text
                assert r.headers["x-fleet-backend"] == decode_id
                receipt: dict[str, object] = json.loads(r.headers["x-fleet-decision"])
                return receipt

            long_doc = "A long document about routing. " * 120  # ~930 estimated tokens
            first = await ask(long_doc)
            assert first["prefill"] == prefill_id
            short = await ask("Hello there")
            assert short["prefill"] is None
            # The same document again: cached on the decode backend now, so it prefills there.
            again = await ask(long_doc + " And a question.")
            assert again["prefill"] is None
            metrics = (await client.get("/metrics")).text
        assert counter(metrics, "fleet_pd_decisions_total", {"outcome": "disaggregated"}) == 1
        assert counter(metrics, "fleet_pd_decisions_total", {"outcome": "short_prompt"}) == 2
        # The proxy really ran the prefill leg on the prefill engine (orchestrated mode).
        assert counter(metrics, "fleet_proxy_pd_prefill_legs_total", {"outcome": "ok"}) == 1
