"""The bench records fleet-proxy's routing receipt per request, so a replay can say why each
turn went where it did: the real proxy (debug_receipts on, least_prefill) in front of simulated
engines on real ports, the bench's own replay sending `x-fleet-debug: 1`."""

from __future__ import annotations

from typing import Any

from bench.records import RequestRecord
from bench.runner import Replay, RunOptions
from bench.synthetic import chat_sessions
from simulator.fleet import start_fleet
from tests.support.servers import fast_settings, running_proxy

MODEL = "sim-llama-8b"


async def replay(url: str, headers: dict[str, str]) -> list[RequestRecord]:
    workload = chat_sessions(
        sessions=2, turns=(3, 3), system_tokens=0, user_tokens=(200, 200), output_tokens=(2, 2)
    )
    records: list[RequestRecord] = []
    opts = RunOptions(base_url=url, model=MODEL, mode="closed", concurrency=1, headers=headers)
    await Replay(opts, "least_prefill", 0, records.append).run(workload)
    return records


async def test_each_record_carries_the_receipt_of_its_decision() -> None:
    async with await start_fleet(2, speed=20.0) as fleet:
        settings = fast_settings(fleet.urls, policy="least_prefill", debug_receipts=True)
        async with running_proxy(settings) as (url, _):
            records = await replay(url, {"x-fleet-debug": "1"})
            plain = await replay(url, {})

    assert len(records) == 6 and all(r.ok for r in records), [r.error for r in records]
    ids = {r.backend for r in records}
    for r in records:
        d: dict[str, Any] | None = r.decision
        assert d is not None
        assert d["backend"] == r.backend  # the receipt names the backend that answered
        assert d["reason"].startswith("least_prefill: ")
        assert ids <= set(d["scores"])  # every candidate's figures, not only the winner's
        assert {"bs", "cached_tokens", "pending_prefill_tokens"} <= set(d["scores"][r.backend])
    # A later turn's receipt shows the history its previous turn left on that backend.
    for r in records:
        if r.turn > 0:
            before = next(
                p for p in records if p.session_id == r.session_id and p.turn == r.turn - 1
            )
            assert r.decision is not None and before.backend is not None
            assert r.decision["scores"][before.backend]["cached_tokens"] > 0
    # Without the header the proxy sends no receipt, and the record says so.
    assert plain and all(r.ok and r.decision is None for r in plain)
