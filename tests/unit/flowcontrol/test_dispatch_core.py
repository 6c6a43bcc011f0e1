"""The dispatch core with an injected clock: strict bands, fairness between tenants, ordering
inside a tenant, TTL and capacity."""

from __future__ import annotations

import itertools

from flowcontrol.core import (
    BAND_FULL,
    TENANT_FULL,
    TTL_EXPIRED,
    BandLimits,
    Dispatch,
    FlowQueues,
    Reject,
    fair_share_victim,
)
from flowcontrol.policies import (
    FirstComeFirstServed,
    LeastAttainedService,
    Ordering,
    RoundRobin,
    TokenWeighted,
    Waiting,
)


class Queues:
    """A pool's queues and a counter of arrivals; `now` is whatever the test says."""

    def __init__(
        self,
        *,
        fairness: type[RoundRobin] | type[TokenWeighted] = RoundRobin,
        ordering: Ordering | None = None,
        ttl: float = 30.0,
        capacity: int = 100,
        tenant_capacity: int = 100,
    ) -> None:
        limits = BandLimits(ttl, capacity, tenant_capacity)
        self.q = FlowQueues(lambda p: limits, fairness, ordering or FirstComeFirstServed())
        self._seq = itertools.count()

    def add(
        self,
        tenant: str = "t",
        priority: int = 0,
        *,
        now: float = 0.0,
        cost: int = 100,
        program: str | None = None,
    ) -> Waiting:
        w = Waiting(
            next(self._seq), tenant, priority, program, cost, now, self.q.deadline(priority, now)
        )
        assert self.q.offer(w) is None
        return w

    def drain(self, now: float = 1.0) -> list[Waiting]:
        out: list[Waiting] = []
        while self.q.count:
            for action in self.q.decide(False, now):
                assert isinstance(action, Dispatch)
                out.append(action.request)
        return out


def test_nothing_is_dispatched_while_the_pool_is_saturated() -> None:
    qs = Queues()
    qs.add()
    assert qs.q.decide(True, 1.0) == []
    assert qs.q.count == 1


def test_bands_are_strict_highest_priority_first_whatever_the_arrival_order() -> None:
    qs = Queues()
    shed = [qs.add("a", -1, now=0.0) for _ in range(3)]
    normal = [qs.add("b", 0, now=0.1) for _ in range(2)]
    high = qs.add("c", 5, now=0.2)
    assert qs.drain() == [high, *normal, *shed]


def test_round_robin_takes_one_request_from_each_tenant_in_turn() -> None:
    qs = Queues()
    noisy = [qs.add("noisy") for _ in range(6)]
    quiet = [qs.add("quiet") for _ in range(2)]
    order = [w.tenant for w in qs.drain()]
    assert order == ["noisy", "quiet", "noisy", "quiet", "noisy", "noisy", "noisy", "noisy"]
    assert len(noisy) + len(quiet) == len(order)


def test_token_weighted_fairness_gives_equal_prompt_tokens_not_equal_requests() -> None:
    qs = Queues(fairness=TokenWeighted)
    for _ in range(4):
        qs.add("big", cost=8000)
    for _ in range(40):
        qs.add("small", cost=500)
    order = [w.tenant for w in qs.drain()]
    # Sixteen 500-token requests for each 8000-token one while both wait.
    first_big = order.index("big")
    second_big = order.index("big", first_big + 1)
    assert order[first_big + 1 : second_big].count("small") == 16
    assert order[:34].count("big") == 2 and order[:34].count("small") == 32


def test_round_robin_would_give_the_big_prompts_sixteen_times_the_tokens() -> None:
    qs = Queues(fairness=RoundRobin)
    for _ in range(4):
        qs.add("big", cost=8000)
    for _ in range(4):
        qs.add("small", cost=500)
    order = qs.drain()
    served = {"big": 0, "small": 0}
    for w in order[:8]:
        served[w.tenant] += w.cost
    assert served["big"] == 16 * served["small"]


def test_a_returning_tenant_earns_no_credit_for_its_idle_time() -> None:
    qs = Queues(fairness=TokenWeighted)
    for _ in range(3):
        qs.add("steady", cost=1000)
    assert [w.tenant for w in qs.drain()] == ["steady"] * 3
    for _ in range(3):
        qs.add("steady", cost=1000)
    for _ in range(3):
        qs.add("back", cost=1000)
    # Level with the waiting tenant: alternating, not three of its own first.
    assert [w.tenant for w in qs.drain()] == ["steady", "back"] * 3


def test_fcfs_serves_a_tenant_in_arrival_order() -> None:
    qs = Queues()
    a, b, c = (qs.add(program=p, now=t) for p, t in (("x", 0.0), ("y", 0.1), ("x", 0.2)))
    assert qs.drain() == [a, b, c]


def test_las_serves_the_program_with_the_least_attained_service_first() -> None:
    las = LeastAttainedService(starvation_threshold=10.0)
    las.credit("long-agent", 50_000)
    las.credit("short-agent", 300)
    qs = Queues(ordering=las)
    long_ = qs.add(program="long-agent", now=0.0)
    short = qs.add(program="short-agent", now=0.1)
    fresh = qs.add(program="new-agent", now=0.2)
    assert qs.drain(now=1.0) == [fresh, short, long_]


def test_las_counts_the_prompt_tokens_it_dispatches_as_service() -> None:
    las = LeastAttainedService(starvation_threshold=10.0)
    qs = Queues(ordering=las)
    a1 = qs.add(program="a", cost=1000, now=0.0)
    a2 = qs.add(program="a", cost=1000, now=0.1)
    b1 = qs.add(program="b", cost=10, now=0.2)
    # a1 first (both at 0, arrival order), then b (10 < 1000), then a2.
    assert qs.drain(now=1.0) == [a1, b1, a2]
    assert las.stats() == {"a": 2000, "b": 10}


def test_las_promotes_a_request_that_waited_past_the_starvation_threshold() -> None:
    las = LeastAttainedService(starvation_threshold=5.0)
    las.credit("heavy", 1_000_000)
    qs = Queues(ordering=las)
    old = qs.add(program="heavy", now=0.0)
    light = qs.add(program="light", now=4.0)
    assert [a.request for a in qs.q.decide(False, 4.5)] == [light]  # not starving yet
    qs.q.offer(light)
    light2 = qs.add(program="light", now=5.5)
    assert [a.request for a in qs.q.decide(False, 6.0)] == [old]  # waited 6 s >= 5 s
    assert qs.drain(now=6.0) == [light, light2]


def test_a_request_past_its_ttl_is_refused_and_leaves_the_queue() -> None:
    qs = Queues(ttl=2.0)
    early = qs.add(now=0.0)
    late = qs.add(now=1.5)
    assert qs.q.decide(True, 1.9) == []
    assert qs.q.decide(True, 2.0) == [Reject(early, TTL_EXPIRED)]
    assert qs.q.count == 1
    assert qs.q.decide(False, 2.1) == [Dispatch(late)]


def test_a_full_band_or_tenant_refuses_the_newcomer() -> None:
    qs = Queues(capacity=3, tenant_capacity=2)
    qs.add("a")
    qs.add("a")
    third_of_a = Waiting(99, "a", 0, None, 1, 0.0, 30.0)
    assert qs.q.offer(third_of_a) == Reject(third_of_a, TENANT_FULL)
    qs.add("b")
    one_too_many = Waiting(100, "c", 0, None, 1, 0.0, 30.0)
    assert qs.q.offer(one_too_many) == Reject(one_too_many, BAND_FULL)
    assert qs.q.count == 3


def test_requests_waiting_in_other_queues_count_against_the_limits() -> None:
    qs = Queues(capacity=4, tenant_capacity=2)
    qs.add("a")
    second_of_a = Waiting(99, "a", 0, None, 1, 0.0, 30.0)
    # One more of tenant a waits in another worker: a's share of the band is full.
    assert qs.q.offer(second_of_a, elsewhere=(1, 1)) == Reject(second_of_a, TENANT_FULL)
    # Three of other tenants wait elsewhere: with the one here, the band is full.
    first_of_b = Waiting(100, "b", 0, None, 1, 0.0, 30.0)
    assert qs.q.offer(first_of_b, elsewhere=(3, 0)) == Reject(first_of_b, BAND_FULL)
    assert qs.q.offer(first_of_b, elsewhere=(2, 0)) is None
    assert qs.q.count == 2


def test_bands_have_their_own_limits() -> None:
    limits = {0: BandLimits(30.0, 10, 10), -1: BandLimits(1.0, 1, 1)}
    q = FlowQueues(limits.__getitem__, RoundRobin, FirstComeFirstServed())
    shed = Waiting(1, "t", -1, None, 1, 0.0, q.deadline(-1, 0.0))
    assert q.offer(shed) is None
    assert q.offer(Waiting(2, "u", -1, None, 1, 0.0, 1.0)) is not None  # band of one
    assert q.offer(Waiting(3, "t", 0, None, 1, 0.0, q.deadline(0, 0.0))) is None
    assert q.decide(True, 1.0) == [Reject(shed, TTL_EXPIRED)]


def test_a_removed_request_is_never_dispatched() -> None:
    qs = Queues()
    gone = qs.add("a")
    kept = qs.add("b")
    assert qs.q.remove(gone)
    assert not qs.q.remove(gone)
    assert qs.drain() == [kept]
    assert qs.q.depths() == {}


def test_the_top_priority_is_the_highest_band_with_requests_waiting() -> None:
    qs = Queues()
    assert qs.q.top_priority() is None
    qs.add("a", -1)
    high = qs.add("b", 3)
    assert qs.q.top_priority() == 3
    assert qs.q.remove(high)
    assert qs.q.top_priority() == -1


def test_room_goes_to_a_higher_band_waiting_in_another_queue() -> None:
    """Another worker holds a band above every one here: this pool dispatches nothing, but
    its expired requests are still refused; a band level with it or no band elsewhere
    dispatches as usual."""
    qs = Queues(ttl=10.0)
    old = qs.add("a", 0, now=0.0)
    fresh = qs.add("a", 0, now=5.0)
    assert qs.q.decide(False, 11.0, elsewhere=3) == [Reject(old, TTL_EXPIRED)]
    assert qs.q.count == 1
    assert qs.q.decide(False, 11.0, elsewhere=0) == [Dispatch(fresh)]
    late = qs.add("b", 3, now=11.0)
    assert qs.q.decide(False, 11.5, elsewhere=3) == [Dispatch(late)]
    qs.add("b", -1, now=11.5)
    assert qs.q.decide(False, 12.0, elsewhere=None) != []


def test_with_running_counts_the_room_goes_to_the_tenant_running_fewest() -> None:
    qs = Queues()
    qs.add("noisy", now=0.0)
    qs.add("noisy", now=0.1)
    qs.add("quiet", now=0.2)
    running = {0: {"noisy": 7, "quiet": 1}}
    # Round robin would serve noisy first (it has waited longest); quiet runs 6 fewer.
    first = qs.q.decide(False, 1.0, usage=running.__getitem__)
    assert [a.request.tenant for a in first] == ["quiet"]
    # Level (or the picked tenant running fewer): fairness decides as without counts.
    running[0] = {"noisy": 1, "quiet": 1}
    qs.add("quiet", now=0.3)
    assert [a.request.tenant for a in qs.q.decide(False, 1.0, usage=running.__getitem__)] == [
        "noisy"
    ]


def test_running_counts_are_read_per_band_and_only_among_waiting_tenants() -> None:
    qs = Queues()
    qs.add("a", 5)
    qs.add("b", 0)
    asked: list[int] = []

    def running(priority: int) -> dict[str, int]:
        asked.append(priority)
        return {"a": 9, "b": 0}

    # The higher band goes first whatever it runs, and with one tenant waiting there, no
    # counts are needed.
    assert [a.request.tenant for a in qs.q.decide(False, 1.0, usage=running)] == ["a"]
    assert asked == []


def test_the_fair_share_victim_runs_at_least_two_more_than_the_poorest_waiting_tenant() -> None:
    assert fair_share_victim(["quiet"], {"noisy": 8}) == "noisy"
    assert fair_share_victim(["quiet"], {"noisy": 8, "quiet": 6}) == "noisy"
    # One more only: after a move the other would run more, and the seat would move back.
    assert fair_share_victim(["quiet"], {"noisy": 8, "quiet": 7}) is None
    # The waiting tenant is itself the busiest: nothing to take.
    assert fair_share_victim(["noisy"], {"noisy": 8}) is None
    # Several waiting: measured against the one running fewest; the busiest gives a seat.
    assert fair_share_victim(["b", "c"], {"a": 5, "b": 4, "c": 1}) == "a"
    assert fair_share_victim([], {"a": 5}) is None
    assert fair_share_victim(["a"], {}) is None
