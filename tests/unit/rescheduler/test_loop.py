import asyncio
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from rescheduler.config import ReschedulerConfig
from rescheduler.decide import Plan, PolicyOutcome
from rescheduler.executor import MoveOutcome
from rescheduler.loop import ReschedulerLoop
from rescheduler.metrics import ReschedulerMetrics
from rescheduler.view import ClusterView, InferType, InstanceView, Migration, RequestView
from tests.support.polling import eventually


def a_view(t: float) -> ClusterView:
    r = RequestView("up-1", "r1", 0.0, 10, 5, True, True)
    return ClusterView(
        t,
        (InstanceView("a", InferType.NEUTRAL, requests=(r,)),
         InstanceView("b", InferType.NEUTRAL, schedulable=False)),
    )  # fmt: skip


class Views:
    def __init__(self) -> None:
        self.taken = 0
        self.fail = False

    async def view(self) -> ClusterView:
        if self.fail:
            raise ConnectionError("proxy unreachable")
        self.taken += 1
        return a_view(float(self.taken))


class Recorder:
    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.batches: list[Sequence[Migration]] = []
        self.running = 0
        self.overlapped = False

    async def execute(self, migrations: Sequence[Migration]) -> list[MoveOutcome]:
        self.running += 1
        self.overlapped |= self.running > 1
        self.batches.append(migrations)
        await asyncio.sleep(self.delay)
        self.running -= 1
        return [MoveOutcome(m.policy, k, m.source, m.target, "ok") for m in migrations
                for k in m.requests]  # fmt: skip


def moving_decide(view: ClusterView, config: ReschedulerConfig, now: float) -> Plan:
    assert now == view.taken_at  # the view's own time, not this process's clock
    m = Migration("neutral_failover", "a", "c", ("up-1",))
    return Plan((m,), (PolicyOutcome("neutral_failover", ("b",), ("c",), (m,), ""),
                       PolicyOutcome("neutral_load", (), (), (), "no pair")))  # fmt: skip


def idle_decide(view: ClusterView, config: ReschedulerConfig, now: float) -> Plan:
    return Plan((), (PolicyOutcome("neutral_load", (), (), (), "balanced"),))


def make(executor: Recorder, decide=moving_decide, history: int = 3):  # type: ignore[no-untyped-def]
    reg = CollectorRegistry()
    loop = ReschedulerLoop(Views(), executor, ReschedulerConfig(), ReschedulerMetrics(reg),
                           interval_s=0.01, history=history, decide=decide)  # fmt: skip
    return loop, reg


async def test_one_cycle_decides_executes_and_records() -> None:
    ex = Recorder()
    loop, reg = make(ex)
    rec = await loop.cycle()
    assert len(ex.batches) == 1 and ex.batches[0][0].requests == ("up-1",)
    assert (rec.instances, rec.schedulable, rec.requests, rec.movable) == (2, 1, 1, 1)
    assert rec.outcomes == {"ok": 1} and rec.notes == {
        "neutral_failover": "",
        "neutral_load": "no pair",
    }
    assert rec.as_json()["pairs"][0]["target"] == "c"
    assert reg.get_sample_value("fleet_proxy_rescheduling_cycles_total") == 1
    assert (
        reg.get_sample_value("fleet_proxy_rescheduling_pairs_total", {"policy": "neutral_failover"})
        == 1
    )
    assert reg.get_sample_value("fleet_proxy_rescheduling_cycle_seconds_count") == 1


async def test_nothing_to_move_calls_no_executor() -> None:
    ex = Recorder()
    loop, _ = make(ex, idle_decide)
    rec = await loop.cycle()
    assert ex.batches == [] and rec.pairs == () and rec.outcomes == {}


async def test_history_keeps_the_last_cycles_and_a_failed_view_is_recorded() -> None:
    ex = Recorder()
    loop, _ = make(ex, history=3)
    for _ in range(4):
        await loop.cycle()
    assert [c.error for c in loop.history()] == ["", "", ""]
    assert isinstance(loop.source, Views)
    loop.source.fail = True
    rec = await loop.cycle()
    assert "proxy unreachable" in rec.error and loop.history()[-1] is rec
    assert len(loop.history()) == 3


async def test_cycles_never_overlap() -> None:
    ex = Recorder(delay=0.05)  # each execution outlasts the interval
    loop, _ = make(ex)
    task = asyncio.create_task(loop.run())
    await eventually(lambda: len(ex.batches) >= 3, what="three cycles")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert not ex.overlapped


async def test_the_ends_of_a_move_are_settling_in_the_next_views() -> None:
    seen: list[ClusterView] = []

    def watching(view: ClusterView, config: ReschedulerConfig, now: float) -> Plan:
        seen.append(view)
        return moving_decide(view, config, now)

    loop, _ = make(Recorder(), decide=watching)
    await loop.cycle()
    await loop.cycle()
    # The views never scrape (scraped_at None): a, the source, stays settling; c, the
    # target, is not in the fleet.
    assert [i.id for i in seen[0].instances if i.settling] == []
    assert [i.id for i in seen[1].instances if i.settling] == ["a"]


async def test_cycles_that_moved_outlast_idle_ones_in_their_own_history() -> None:
    moving = [True, False, False, False, False]

    def sometimes(view: ClusterView, config: ReschedulerConfig, now: float) -> Plan:
        return moving_decide(view, config, now) if moving.pop(0) else idle_decide(view, config, now)

    loop, _ = make(Recorder(), decide=sometimes, history=3)
    for _ in range(5):
        await loop.cycle()
    assert all(not c.pairs for c in loop.history())
    assert [len(c.pairs) for c in loop.migrating_history()] == [1]
