"""Autellix's Algorithm 2 (program-aware load balancing), one test class per aspect of it.

The proxy's accounting is played by hand: a dispatch adds one request in flight to the chosen
backend and a completion removes it, as proxy/request/entry.py does.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import Backend
from policies.policy import NoCandidate
from policies.registry import build_policy
from policies.rendezvous import home, ranked
from tests.unit.policies.builders import backend, ctx


def engines(n: int = 3) -> list[Backend]:
    return [backend(f"engine_{i}") for i in range(n)]


def route(
    policy: Any,
    pool: list[Backend],
    pid: str | None,
    tokens: int,
    now: float = 0.0,
    keep: bool = True,
) -> Backend:
    target: Backend = policy.pick(ctx(tokens=tokens, program=pid), pool, now).target
    if keep:
        target.load.in_flight += 1  # the request stays active
    return target


def stats(policy: Any) -> dict[str, Any]:
    result: dict[str, Any] = policy.stats()["autellix"]
    return result


class TestRequestClassification:
    @pytest.mark.parametrize(
        ("tokens", "kind"), [(0, "small"), (1500, "small"), (2048, "small"), (2049, "large")]
    )
    def test_threshold_is_2048_inclusive(self, tokens: int, kind: str) -> None:
        policy = build_policy("autellix")
        route(policy, engines(), "p", tokens)
        assert stats(policy)[f"{kind}_requests"] == 1

    def test_threshold_is_configurable(self) -> None:
        policy = build_policy("autellix", {"threshold_tokens": 100})
        route(policy, engines(), "p", 101)
        assert stats(policy)["large_requests"] == 1


class TestSmallRequestLoadBalancing:
    def test_small_requests_go_to_the_least_used(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        pool[0].load.in_flight, pool[1].load.in_flight = 4, 2
        assert route(policy, pool, "p", 100) is pool[2]

    def test_small_requests_spread_over_engines(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        chosen = [route(policy, pool, f"p{i}", 100).id for i in range(6)]
        assert all(b.load.in_flight == 2 for b in pool)
        assert sorted(chosen) == sorted([b.id for b in pool] * 2)


class TestLargeRequestLocality:
    def test_a_program_goes_to_its_rendezvous_home_however_loaded(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        target = home("prog", pool)
        target.load.in_flight = 5  # the busiest: the paper's least-used would not pick it
        assert route(policy, pool, "prog", 3000) is target
        assert stats(policy)["locality_assigns"] == 1

    def test_later_large_requests_stay_with_the_program_even_when_it_is_busy(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        first = route(policy, pool, "prog", 3000)
        first.load.in_flight = 50
        for _ in range(4):
            assert route(policy, pool, "prog", 3500) is first
        assert stats(policy)["locality_hits"] == 4

    def test_session_id_stands_in_for_a_missing_program_id(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        assert policy.pick(ctx(tokens=3000, session="sess"), pool, 0.0).target is home("sess", pool)

    def test_two_processes_agree_whatever_each_has_seen(self) -> None:
        # One policy per worker process, with different histories and small calls between.
        pool = engines(4)
        first, second = build_policy("autellix"), build_policy("autellix")
        programs = [f"p{i}" for i in range(40)]
        for p in programs[:20]:
            route(first, pool, p, 5000)
            route(second, pool, p, 100)
        for p in programs:
            assert route(first, pool, p, 5000) is route(second, pool, p, 5000)

    def test_programs_spread_over_engines(self) -> None:
        policy = build_policy("autellix")
        pool = engines(4)
        for i in range(400):
            route(policy, pool, f"p{i}", 5000, keep=False)
        homed = [e["programs_homed"] for e in stats(policy)["engines"].values()]
        assert sum(homed) == 400 and min(homed) > 70, homed  # 100 each on average


class TestMixedRequestPatterns:
    def test_the_papers_usage_example(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        route(policy, pool, "session_123", 1500)  # small -> least used
        assert stats(policy)["active_programs"] == 0
        assigned = route(policy, pool, "session_123", 3000)  # large -> its home
        assert route(policy, pool, "session_123", 3500) is assigned  # again
        s = stats(policy)
        assert (s["total_requests"], s["active_programs"], s["locality_hits"]) == (3, 1, 1)

    def test_small_requests_ignore_the_program_home(self) -> None:
        policy = build_policy("autellix")
        pool = engines(2)
        first = route(policy, pool, "p", 5000)
        first.load.in_flight = 10
        assert route(policy, pool, "p", 10) is not first
        assert route(policy, pool, "p", 5000) is first


class TestEngineManagement:
    def test_a_removed_engines_programs_go_to_their_next_ranked(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        first, second = ranked("p", pool)[:2]
        assert route(policy, pool, "p", 5000) is first
        policy.on_backend_removed(first.id)
        assert stats(policy)["engines"].get(first.id) is None
        rest = [b for b in pool if b is not first]
        assert route(policy, rest, "p", 5000) is second
        assert route(policy, rest, "p", 5000) is second
        assert stats(policy)["reassignments"] == 1

    def test_a_returning_engine_gets_its_programs_back(self) -> None:
        # As a fresh engine: the move back counts as a reassignment, not a locality hit.
        policy = build_policy("autellix")
        pool = engines(2)
        first = route(policy, pool, "p", 5000)
        policy.on_backend_removed(first.id)
        assert route(policy, pool, "p", 5000) is first
        s = stats(policy)
        assert (s["reassignments"], s["locality_hits"]) == (1, 0)

    def test_new_engines_are_used(self) -> None:
        policy = build_policy("autellix")
        pool = engines(2)
        for b in pool:
            b.load.in_flight = 3
        pool.append(backend("engine_new"))
        assert route(policy, pool, "q", 100).id == "engine_new"


class TestRequestCompletion:
    def test_completion_lowers_workload_and_changes_routing(self) -> None:
        policy = build_policy("autellix")
        pool = engines(2)
        a = route(policy, pool, "x", 100)
        b = route(policy, pool, "y", 100)
        assert {a.id, b.id} == {"engine_0", "engine_1"}
        route(policy, pool, "z", 100)  # one engine now has 2
        busy = max(pool, key=lambda e: e.load.in_flight)
        busy.load.in_flight -= 2  # two of its requests completed
        assert route(policy, pool, "w", 100) is busy
        assert stats(policy)["engines"][busy.id]["active_requests"] == 1


class TestProgramRemoval:
    def test_end_program_forgets_it_but_its_home_stays(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        first = route(policy, pool, "p", 5000)
        assert policy.end_program("p") is True
        assert policy.end_program("p") is False
        assert stats(policy)["active_programs"] == 0
        assert route(policy, pool, "p", 5000) is first
        assert stats(policy)["locality_assigns"] == 2

    def test_idle_programs_expire_after_the_ttl(self) -> None:
        policy = build_policy("autellix", {"idle_ttl_s": 60})
        pool = engines()
        route(policy, pool, "old", 5000, now=0.0)
        route(policy, pool, "fresh", 5000, now=50.0)
        route(policy, pool, "other", 100, now=90.0)  # any request sweeps expired programs
        s = stats(policy)
        assert s["active_programs"] == 1 and s["expired_programs"] == 1

    def test_the_record_is_bounded(self) -> None:
        policy = build_policy("autellix", {"max_programs": 2})
        pool = engines()
        for pid in "abc":
            route(policy, pool, pid, 5000)
        assert stats(policy)["active_programs"] == 2


class TestStatistics:
    def test_counters_and_per_engine_view(self) -> None:
        policy = build_policy("autellix")
        pool = engines(2)
        for i in range(3):
            route(policy, pool, f"s{i}", 100)
        for _ in range(2):
            route(policy, pool, "big", 4000)
        s = stats(policy)
        assert (s["total_requests"], s["small_requests"], s["large_requests"]) == (5, 3, 2)
        assert (s["locality_assigns"], s["locality_hits"]) == (1, 1)
        assert sum(e["programs_homed"] for e in s["engines"].values()) == 1
        assert sum(e["active_requests"] for e in s["engines"].values()) == 5
        assert all(e["workload"] == e["active_requests"] for e in s["engines"].values())


class TestEdgeCases:
    def test_no_engines(self) -> None:
        with pytest.raises(NoCandidate):
            build_policy("autellix").pick(ctx(tokens=5000, program="p"), [], 0.0)

    def test_zero_tokens_is_a_small_request(self) -> None:
        policy = build_policy("autellix")
        route(policy, engines(), "p", 0)
        assert stats(policy)["small_requests"] == 1

    def test_large_request_without_any_program_is_balanced(self) -> None:
        policy = build_policy("autellix")
        route(policy, engines(), None, 9000)
        s = stats(policy)
        assert s["active_programs"] == 0 and s["small_requests"] == 1

    def test_unknown_program_end_is_false(self) -> None:
        assert build_policy("autellix").end_program("nobody") is False
