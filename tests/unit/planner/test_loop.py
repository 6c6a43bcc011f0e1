"""The planning loop with a fake connector, an in-memory proxy admin and a fake clock."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from fleet.clock import FakeClock
from fleet.types import Role
from planner.config import PlannerConfig, PlannerRole, Topology
from planner.connector import FakeConnector, WorkerInfo
from planner.decide import Decision, Reason
from planner.drain import choose_victim, drain
from planner.loop import DecisionRecord, PlannerLoop
from planner.proxy_admin import BackendStatus, LiveRequest
from tests.unit.planner.fake_admin import FakeAdmin

CONFIG = PlannerConfig(
    metric_pulling_interval=0.5, adjustment_interval=2.0, new_decode_worker_grace_period=2
)


@dataclass
class DrainingFake:
    """FakeConnector's counts, with the workers as backends of the fake proxy: scale-up adds
    one, scale-down drains the cheapest first."""

    admin: FakeAdmin
    clock: FakeClock
    fake: FakeConnector = field(default_factory=FakeConnector)
    added: int = 0

    async def workers(self, role: PlannerRole) -> list[WorkerInfo]:
        side = {Role.PREFILL} if role is PlannerRole.PREFILL else {Role.DECODE, Role.BOTH}
        return [
            WorkerInfo(b.id, b.url, role)
            for b in await self.admin.backends()
            if b.role in side and not b.draining
        ]

    async def set_replicas(self, role: PlannerRole, n: int) -> None:
        current = await self.workers(role)
        if n > len(current):
            self.added += 1
            await self.admin.add_backend(f"{role}-new{self.added}", "", Role(role.value))
        elif n < len(current):
            tokens: dict[str, list[int]] = {}
            for r in await self.admin.live_requests():
                tokens.setdefault(r.backend, []).append(r.tokens)
            victim = choose_victim(current, tokens)
            await drain(self.admin, victim.id, 5.0, self.clock, sleep=self._sleep)
        await self.fake.set_replicas(role, n)

    async def _sleep(self, s: float) -> None:
        self.clock.advance(s)


async def test_kv_scales_decode_up_then_down_after_grace() -> None:
    clock = FakeClock(0.0)
    admin = FakeAdmin()
    admin.add("p0", Role.PREFILL, waiting=0.3)  # prefill queue in band throughout
    admin.add("d0", Role.DECODE)
    admin.live = [LiveRequest("d0", 500, 20)]  # the old worker holds more tokens
    connector = DrainingFake(admin, clock)
    loop = PlannerLoop(admin, connector, CONFIG, clock=clock)
    state = await loop.start()
    assert (state.prefill_replicas, state.decode_replicas) == (1, 1)

    async def run_for(seconds: float, kv: float) -> None:
        admin.set_kv(kv)
        for _ in range(int(seconds / CONFIG.metric_pulling_interval)):
            clock.advance(CONFIG.metric_pulling_interval)
            await loop.tick()

    await run_for(2.0, kv=0.95)
    assert connector.fake.calls == [(PlannerRole.DECODE, 2)]
    assert loop.state is not None and loop.state.decode_replicas == 2
    assert not loop.state.change_in_progress
    added = "decode-new1"
    assert added in admin.backends_by_id

    # Idle now, but the grace holds decode for two adjustments.
    await run_for(4.0, kv=0.1)
    reasons = [r.decision.role(PlannerRole.DECODE).reason for r in loop.decisions()]
    assert reasons == [Reason.SCALE_UP_KV, Reason.HOLD_GRACE, Reason.HOLD_GRACE]
    assert connector.fake.calls == [(PlannerRole.DECODE, 2)]

    await run_for(2.0, kv=0.1)
    assert connector.fake.calls[-1] == (PlannerRole.DECODE, 1)
    # The cheapest worker (the new, idle one) was drained, evacuated, then unregistered.
    assert admin.calls[-3:] == [("drain", added), ("evacuate", added), ("remove", added)]
    assert loop.state is not None and loop.state.decode_replicas == 1
    prefill = [r.decision.role(PlannerRole.PREFILL).reason for r in loop.decisions()]
    assert set(prefill) == {Reason.HOLD_IN_BAND}


async def one_hot_adjustment(connector: FakeConnector) -> tuple[PlannerLoop, DecisionRecord]:
    """An aggregated fleet of one decode worker at 95% KV, run through one adjustment
    (4 pulls of 0.5 s, adjusting every 2 s): the loop and that adjustment's record."""
    clock = FakeClock(0.0)
    admin = FakeAdmin()
    admin.add("d0", Role.DECODE, kv=0.95)
    config = PlannerConfig(
        metric_pulling_interval=0.5, adjustment_interval=2.0, topology=Topology.AGGREGATED
    )
    loop = PlannerLoop(admin, connector, config, clock=clock)
    await loop.start()
    for _ in range(4):
        clock.advance(0.5)
        await loop.tick()
    return loop, loop.decisions()[-1]


async def test_failed_change_reads_counts_back() -> None:
    class Failing(FakeConnector):
        async def set_replicas(self, role: PlannerRole, n: int) -> None:
            raise RuntimeError("no GPU free")

    connector = Failing({PlannerRole.DECODE: 1})
    loop, last = await one_hot_adjustment(connector)
    assert last.decision.apply
    assert last.errors and "no GPU free" in last.errors[0]
    assert loop.state is not None
    assert loop.state.decode_replicas == 1 and not loop.state.change_in_progress


async def test_unreachable_proxy_is_no_sample() -> None:
    clock = FakeClock(0.0)

    class Down(FakeAdmin):
        async def backends(self) -> list[BackendStatus]:
            raise OSError("connection refused")

    loop = PlannerLoop(Down(), FakeConnector({PlannerRole.DECODE: 1}), CONFIG, clock=clock)
    await loop.start()
    for _ in range(4):
        clock.advance(0.5)
        decision = await loop.tick()
    assert decision.due and not decision.apply
    assert decision.role(PlannerRole.DECODE).reason is Reason.HOLD_NO_DATA


async def test_a_failed_read_back_does_not_leave_the_change_in_progress() -> None:
    class ApiDownAfterChange(FakeConnector):
        async def workers(self, role: PlannerRole) -> list[WorkerInfo]:
            if self.calls:  # the change went through, then the API went away
                raise OSError("API server unreachable")
            return await super().workers(role)

    connector = ApiDownAfterChange({PlannerRole.DECODE: 1})
    loop, last = await one_hot_adjustment(connector)
    assert connector.calls == [(PlannerRole.DECODE, 2)]
    assert any("reading the replicas back" in e for e in last.errors)
    # The state holds what the change aimed for, and the next interval can start.
    assert loop.state is not None
    assert loop.state.decode_replicas == 2 and not loop.state.change_in_progress


async def test_run_survives_a_failing_tick() -> None:
    admin = FakeAdmin()
    admin.add("d0", Role.DECODE, kv=0.3)
    ticks = 0

    class FlakyLoop(PlannerLoop):
        async def tick(self) -> Decision:
            nonlocal ticks
            ticks += 1
            if ticks == 1:
                raise RuntimeError("transient")
            if ticks == 3:
                raise asyncio.CancelledError
            return await super().tick()

    config = PlannerConfig(metric_pulling_interval=0.001, topology=Topology.AGGREGATED)
    loop = FlakyLoop(admin, FakeConnector({PlannerRole.DECODE: 1}), config)
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(loop.run(), timeout=10)
    assert ticks == 3 and loop.state is not None  # it went on after the failed tick
