"""Autellix's Algorithm 2 (program-aware load balancing), one test class per aspect of it.

The proxy's accounting is played by hand: a dispatch adds one request in flight to the chosen
backend and a completion removes it, as proxy/forward.py does.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleet.types import Backend
from policies.base import NoCandidate
from policies.registry import build_policy
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
    def test_first_large_request_assigns_the_least_used(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        pool[0].load.in_flight = pool[2].load.in_flight = 5
        assert route(policy, pool, "prog", 3000) is pool[1]
        assert stats(policy)["locality_assigns"] == 1

    def test_later_large_requests_stay_with_the_program_even_when_it_is_busy(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        home = route(policy, pool, "prog", 3000)
        home.load.in_flight = 50
        for _ in range(4):
            assert route(policy, pool, "prog", 3500) is home
        assert stats(policy)["locality_hits"] == 4

    def test_session_id_stands_in_for_a_missing_program_id(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        first = policy.pick(ctx(tokens=3000, session="sess"), pool, 0.0).target
        first.load.in_flight = 9
        assert policy.pick(ctx(tokens=3000, session="sess"), pool, 0.0).target is first


class TestMixedRequestPatterns:
    def test_seed_usage_example(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        route(policy, pool, "session_123", 1500)  # small -> least used
        assert stats(policy)["programs_in_table"] == 0
        assigned = route(policy, pool, "session_123", 3000)  # large -> assigned
        assert route(policy, pool, "session_123", 3500) is assigned  # reused
        s = stats(policy)
        assert (s["total_requests"], s["programs_in_table"], s["locality_hits"]) == (3, 1, 1)

    def test_small_requests_ignore_the_program_table(self) -> None:
        policy = build_policy("autellix")
        pool = engines(2)
        home = route(policy, pool, "p", 5000)
        home.load.in_flight = 10
        assert route(policy, pool, "p", 10) is not home
        assert route(policy, pool, "p", 5000) is home


class TestEngineManagement:
    def test_an_unregistered_engine_loses_its_programs_until_their_next_request(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        home = route(policy, pool, "p", 5000)
        policy.on_backend_removed(home.id)
        assert stats(policy)["engines"].get(home.id) is None
        rest = [b for b in pool if b is not home]
        new_home = route(policy, rest, "p", 5000)
        assert new_home is not home
        assert route(policy, rest, "p", 5000) is new_home
        assert stats(policy)["reassignments"] == 1

    def test_a_returning_engine_does_not_keep_its_old_programs(self) -> None:
        policy = build_policy("autellix")
        pool = engines(2)
        home = route(policy, pool, "p", 5000)  # home now has one request in flight
        policy.on_backend_removed(home.id)
        # It comes back under the same id: the program is placed anew, on the least used.
        assert route(policy, pool, "p", 5000) is not home
        assert stats(policy)["reassignments"] == 1

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
    def test_end_program_clears_its_table_entry(self) -> None:
        policy = build_policy("autellix")
        pool = engines()
        route(policy, pool, "p", 5000)
        assert policy.end_program("p") is True
        assert policy.end_program("p") is False
        assert stats(policy)["programs_in_table"] == 0
        route(policy, pool, "p", 5000)
        assert stats(policy)["locality_assigns"] == 2

    def test_idle_programs_expire_after_the_ttl(self) -> None:
        policy = build_policy("autellix", {"idle_ttl_s": 60})
        pool = engines()
        route(policy, pool, "old", 5000, now=0.0)
        route(policy, pool, "fresh", 5000, now=50.0)
        route(policy, pool, "other", 100, now=90.0)  # any request sweeps expired programs
        s = stats(policy)
        assert s["programs_in_table"] == 1 and s["expired_programs"] == 1

    def test_table_is_bounded(self) -> None:
        policy = build_policy("autellix", {"max_programs": 2})
        pool = engines()
        for pid in "abc":
            route(policy, pool, pid, 5000)
        assert stats(policy)["programs_in_table"] == 2


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
        assert sum(e["programs_assigned"] for e in s["engines"].values()) == 1
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
        assert s["programs_in_table"] == 0 and s["small_requests"] == 1

    def test_unknown_program_end_is_false(self) -> None:
        assert build_policy("autellix").end_program("nobody") is False
