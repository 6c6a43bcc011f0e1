"""What the planner reports as it runs: Prometheus metrics, TensorBoard files, the journal
behind `status()`, all fed by a real `PlannerLoop` (fake connector, in-memory proxy admin,
fake clock) and by a `LocalConnector` drain."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import CollectorRegistry

from fleet.clock import FakeClock
from fleet.types import Role
from planner.config import PlannerConfig, PlannerRole, Topology
from planner.connector import FakeConnector
from planner.drain import DrainOutcome, DrainReport
from planner.events import FanOut, Journal
from planner.local import LocalConnector, LocalSettings
from planner.loop import PlannerLoop
from planner.metrics import PlannerMetrics
from planner.proxy_admin import LiveRequest
from planner.tensorboard import TensorBoardEvents
from tests.support.tb_events import scalars, texts
from tests.unit.planner.fake_admin import FakeAdmin

AGG = PlannerConfig(
    metric_pulling_interval=0.5, adjustment_interval=2.0, topology=Topology.AGGREGATED
)


async def run_loop(loop: PlannerLoop, clock: FakeClock, ticks: int) -> None:
    await loop.start()
    for _ in range(ticks):
        clock.advance(0.5)
        await loop.tick()


@dataclass
class Aggregated:
    """One aggregated worker at a given KV utilisation, planned with metrics in `registry`;
    after `run(4)` one decision is due."""

    kv: float
    connector: FakeConnector = field(default_factory=lambda: FakeConnector({PlannerRole.DECODE: 1}))
    clock: FakeClock = field(default_factory=lambda: FakeClock(0.0))
    admin: FakeAdmin = field(default_factory=FakeAdmin)
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        self.admin.add("d0", Role.BOTH, kv=self.kv)
        self.loop = PlannerLoop(
            self.admin, self.connector, AGG, clock=self.clock,
            events=PlannerMetrics(self.registry),
        )  # fmt: skip

    async def run(self, ticks: int) -> None:
        await run_loop(self.loop, self.clock, ticks)


def value(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_metrics_follow_samples_and_decisions() -> None:
    fleet = Aggregated(kv=0.95)
    registry, loop = fleet.registry, fleet.loop
    await fleet.run(4)  # one due decision: scale up
    assert value(registry, "fleet_proxy_planner_decisions_total", role="decode",
                 reason="scale_up_kv") == 1  # fmt: skip
    assert value(registry, "fleet_proxy_planner_desired_replicas", role="decode") == 2
    # FakeConnector's count after set_replicas is what the loop reads back.
    assert value(registry, "fleet_proxy_planner_replicas", role="decode") == 2
    assert value(registry, "fleet_proxy_planner_interval_load", role="decode") == 0.95
    fleet.admin.set_kv(0.7)
    fleet.clock.advance(0.5)
    await loop.tick()  # a pull, not yet a decision
    assert value(registry, "fleet_proxy_planner_load", role="decode") == 0.7
    assert value(registry, "fleet_proxy_planner_interval_load", role="decode") == 0.95
    assert value(registry, "fleet_proxy_planner_load", role="prefill") is None  # no worker
    assert value(registry, "fleet_proxy_planner_change_errors_total") == 0


async def test_failed_changes_are_counted() -> None:
    class Failing(FakeConnector):
        async def set_replicas(self, role: PlannerRole, n: int) -> None:
            raise RuntimeError("no GPU free")

    fleet = Aggregated(kv=0.95, connector=Failing({PlannerRole.DECODE: 1}))
    registry = fleet.registry
    await fleet.run(4)
    assert value(registry, "fleet_proxy_planner_change_errors_total") == 1
    assert value(registry, "fleet_proxy_planner_replicas", role="decode") == 1
    assert value(registry, "fleet_proxy_planner_desired_replicas", role="decode") == 2


def test_drain_metrics_split_requests_by_fate() -> None:
    registry = CollectorRegistry()
    metrics = PlannerMetrics(registry)
    metrics.on_drain(
        PlannerRole.DECODE,
        DrainReport("w1", DrainOutcome.DRAINED, 0, 3.0, {"ok": 2, "not_movable": 1}, "", 5),
    )
    metrics.on_drain(
        PlannerRole.DECODE, DrainReport("w2", DrainOutcome.DRAIN_TIMEOUT, 1, 60.0, {}, "", 1)
    )
    drains = "fleet_proxy_planner_drains_total"
    assert value(registry, drains, role="decode", outcome="drained") == 1
    assert value(registry, drains, role="decode", outcome="drain_timeout") == 1
    requests = "fleet_proxy_planner_drained_requests_total"
    assert value(registry, requests, how="moved") == 2
    assert value(registry, requests, how="finished") == 3
    assert value(registry, requests, how="left") == 1
    assert value(registry, "fleet_proxy_planner_drain_duration_seconds_count") == 2
    assert value(registry, "fleet_proxy_planner_drain_duration_seconds_sum") == 63.0


async def test_tensorboard_files_hold_samples_and_decisions(tmp_path: Path) -> None:
    clock = FakeClock(0.0)
    admin = FakeAdmin()
    admin.add("p0", Role.PREFILL, waiting=0.3)
    admin.add("d0", Role.DECODE, kv=0.95)
    board = TensorBoardEvents(tmp_path)
    config = PlannerConfig(metric_pulling_interval=0.5, adjustment_interval=2.0)
    connector = FakeConnector({PlannerRole.PREFILL: 1, PlannerRole.DECODE: 1})
    loop = PlannerLoop(admin, connector, config, clock=clock, events=board)
    await run_loop(loop, clock, 4)
    board.close()
    got = scalars(tmp_path)
    assert got["sample/prefill_queue"] == [(i, 0.30000001192092896) for i in range(1, 5)]
    assert [v for _, v in got["sample/decode_kv"]] == [0.949999988079071] * 4
    assert got["decode/replicas"] == [(1, 2.0)]
    assert got["decode/desired_replicas"] == [(1, 2.0)]
    assert got["prefill/replicas"] == [(1, 1.0)]
    assert [round(v, 3) for _, v in got["decode/interval_load"]] == [0.95]
    reasons = texts(tmp_path)
    assert reasons["decode/reason"] == ["scale_up_kv"]
    assert reasons["prefill/reason"] == ["hold_in_band"]


async def test_local_connector_reports_its_drain_to_the_journal(tmp_path: Path) -> None:
    # A process standing for a worker a previous planner started, found in the state file.
    proc = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        state = tmp_path / "state.json"
        worker = {"id": "planner-decode-9001", "url": "http://127.0.0.1:9001", "role": "decode",
                  "backend_role": "decode", "pid": proc.pid, "port": 9001, "gpus": []}  # fmt: skip
        state.write_text(json.dumps({"workers": [worker]}))
        admin = FakeAdmin()
        admin.add("d0", Role.DECODE)
        admin.add("planner-decode-9001", Role.DECODE)
        admin.live = [LiveRequest("planner-decode-9001", 10, 2)]
        journal = Journal()
        registry = CollectorRegistry()
        settings = LocalSettings(state_file=state, stop_grace_s=0.1, poll_s=0.01)
        connector = LocalConnector(
            admin, settings, events=FanOut(journal, PlannerMetrics(registry))
        )
        await connector.set_replicas(PlannerRole.DECODE, 1)
        assert await asyncio.wait_for(proc.wait(), 10) < 0  # ended by a signal
        assert [d.report.worker_id for d in journal.drains] == ["planner-decode-9001"]
        drains = journal.status()["drains"]
        assert drains[0]["role"] == "decode" and drains[0]["report"]["outcome"] == "drained"
        assert drains[0]["requests"] == {"moved": 1, "finished": 0, "left": 0}
        assert value(registry, "fleet_proxy_planner_drained_requests_total", how="moved") == 1
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_status_shows_last_sample_and_decisions() -> None:
    fleet = Aggregated(kv=0.6)
    await fleet.run(4)
    status = json.loads(json.dumps(fleet.loop.status(), default=str))
    assert status["last_sample"]["decode_kv"] == 0.6 and status["last_sample"]["at"] == 2.0
    assert status["decisions"][-1]["decision"]["roles"][0]["reason"] == "hold_in_band"
    assert status["drains"] == []
    assert status["config"]["topology"] == "aggregated"
