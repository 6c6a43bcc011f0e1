import asyncio

from prometheus_client import CollectorRegistry

from fleet.live import LiveTable
from fleet.registry import FleetRegistry
from fleet.types import BackendSpec
from rescheduler.executor import BoundedExecutor, LocalMover
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.view import Migration
from tests.unit.rescheduler.fakes import FakeEntry


class SlowMover:
    """Records how many moves run at once; keys name what each does."""

    def __init__(self) -> None:
        self.active = 0
        self.most = 0
        self.calls: list[tuple[str, str, str, str]] = []

    async def move(self, key: str, source: str, target: str, reason: str) -> tuple[str, str]:
        self.calls.append((key, source, target, reason))
        self.active += 1
        self.most = max(self.most, self.active)
        try:
            if key.startswith("hang"):
                await asyncio.sleep(30)
            if key.startswith("boom"):
                raise RuntimeError("connection reset")
            await asyncio.sleep(0.01)
            return ("failed", "target refused") if key.startswith("fail") else ("ok", "")
        finally:
            self.active -= 1


def metrics() -> tuple[ReschedulerMetrics, CollectorRegistry]:
    reg = CollectorRegistry()
    return ReschedulerMetrics(reg), reg


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    return reg.get_sample_value(name, labels) or 0.0


async def test_moves_run_concurrently_up_to_the_bound() -> None:
    mover = SlowMover()
    m, _ = metrics()
    ex = BoundedExecutor(mover, m, max_concurrent=3, timeout=5)
    keys = tuple(f"r{i}" for i in range(10))
    out = await ex.execute([Migration("neutral_load", "a", "b", keys[:6]),
                            Migration("neutral_load", "c", "b", keys[6:])])  # fmt: skip
    assert [o.outcome for o in out] == ["ok"] * 10
    assert mover.most == 3
    assert {c[0] for c in mover.calls} == set(keys)
    assert ("r7", "c", "b", "neutral_load") in mover.calls


async def test_failures_and_timeouts_are_counted_and_the_rest_carry_on() -> None:
    mover = SlowMover()
    m, reg = metrics()
    ex = BoundedExecutor(mover, m, max_concurrent=2, timeout=0.2)
    plan = [Migration("decode_failover", "a", "b", ("hang1", "boom1", "fail1", "ok1", "ok2"))]
    out = {o.key: o for o in await ex.execute(plan)}
    assert out["hang1"].outcome == "timeout"
    assert out["boom1"].outcome == "failed" and "connection reset" in out["boom1"].detail
    assert out["fail1"].outcome == "failed"
    assert out["ok1"].outcome == out["ok2"].outcome == "ok"
    assert value(reg, "fleet_proxy_rescheduling_failed_count_total") == 3
    name = "fleet_proxy_rescheduling_migrations_total"
    assert value(reg, name, policy="decode_failover", outcome="ok") == 2
    assert value(reg, name, policy="decode_failover", outcome="timeout") == 1
    assert value(reg, name, policy="decode_failover", outcome="failed") == 2


async def test_a_request_named_twice_moves_once() -> None:
    mover = SlowMover()
    m, _ = metrics()
    ex = BoundedExecutor(mover, m)
    out = await ex.execute([Migration("p", "a", "b", ("r1",)), Migration("q", "a", "c", ("r1",))])
    assert len(out) == 1 and len(mover.calls) == 1


async def test_local_mover_outcomes() -> None:
    fleet = FleetRegistry(stale_after=2.0)
    for bid in ("a", "b"):
        fleet.add(BackendSpec(id=bid, url=f"http://127.0.0.1:1/{bid}"))
    live = LiveTable()
    ok = FakeEntry("r1", "a", "up-1")
    stuck = FakeEntry("r2", "a", "up-2", not_movable="move_limit")
    elsewhere = FakeEntry("r3", "b", "up-3")
    ended = FakeEntry("r4", "a", "up-4", result="finished")
    for e in (ok, stuck, elsewhere, ended):
        live.add(e)
    mover = LocalMover(live, fleet)
    assert await mover.move("up-1", "a", "b", "neutral_load") == ("ok", "")
    assert ok.moves == [("b", "neutral_load")] and ok.backend_id == "b"
    assert await mover.move("up-2", "a", "b", "p") == ("not_movable", "move_limit")
    assert (await mover.move("up-3", "a", "b", "p"))[0] == "not_movable"  # not on a any more
    assert (await mover.move("up-4", "a", "b", "p"))[0] == "finished"
    assert (await mover.move("gone", "a", "b", "p"))[0] == "finished"  # vanished since the view
    assert (await mover.move("up-1", "b", "nope", "p"))[0] == "failed"
    assert elsewhere.moves == [] and stuck.moves == []
