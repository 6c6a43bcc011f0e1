"""The TTFT floor of a replay: each request's first token on an idle engine holding its
conversation's previous prompt, by the engine profile's step model, and the routing
benchmark's section that sets every run beside it."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from bench.ttft_floor import FloorRequest, floor_seconds, replay_floors, requests_of
from simulator.profiles import load_profile
from tests.unit.bench.test_peer_readiness import load

H100 = load_profile("h100-llama-8b")
bench_routing = load("bench_routing")


def test_a_short_cold_prompt_costs_the_overhead_and_one_weight_bound_step() -> None:
    # 100 tokens compute in 3.25 ms, under the 4.8 ms weight read: the step is the read.
    expected = 0.002 + 0.0015 + 0.0048 + 100 * 50 * 1.06e-12
    assert floor_seconds(H100, 100, 0) == pytest.approx(expected)


def test_cached_tokens_are_not_computed_but_their_keys_are_read() -> None:
    cold = floor_seconds(H100, 2000, 0)
    warm = floor_seconds(H100, 2000, 1600)
    # 400 new tokens over 1,600 cached ones: the compute of 400 and the context of 1,600.
    expected = 0.002 + 0.0015 + 400 * 32.5e-6 + 1600 * 39e-9 + 400 * (1600 + 200) * 1.06e-12
    assert warm == pytest.approx(expected)
    assert cold - warm > 1200 * 32.5e-6


def test_a_fully_cached_prompt_still_computes_its_last_token() -> None:
    # vLLM recomputes the last token of a prompt it holds whole, to get its logits.
    assert floor_seconds(H100, 512, 512) == pytest.approx(floor_seconds(H100, 512, 511))


def test_a_prompt_longer_than_the_token_budget_takes_a_step_per_chunk() -> None:
    two = floor_seconds(H100, 10_000, 0)
    first = H100.step_time.duration(8192, 0, 8192 * 4096)
    second = H100.step_time.duration(1808, 8192, 1808 * (8192 + 904))
    assert two == pytest.approx(H100.request_overhead_s + first + second)


def test_a_follow_up_turn_holds_its_previous_prompt_in_whole_blocks() -> None:
    reqs = [
        FloorRequest("s", 0, 1000),
        FloorRequest("s", 1, 1500),
        FloorRequest("t", 0, 300),
    ]
    floors = replay_floors(H100, 0.25, reqs)
    # 1,000 tokens = 62 whole blocks (992 tokens) held; 508 computed; x4 at speed 0.25.
    assert floors[1] == pytest.approx(floor_seconds(H100, 1500, 992) * 4)
    assert floors[0] == pytest.approx(floor_seconds(H100, 1000, 0) * 4)
    assert floors[2] == pytest.approx(floor_seconds(H100, 300, 0) * 4)


def test_a_turn_after_a_failed_one_holds_the_last_served_turn() -> None:
    reqs = [FloorRequest("s", 0, 640), FloorRequest("s", 2, 2000)]
    assert replay_floors(H100, 1.0, reqs)[1] == pytest.approx(floor_seconds(H100, 2000, 640))


def test_speed_must_be_positive() -> None:
    with pytest.raises(ValueError):
        replay_floors(H100, 0, [FloorRequest("s", 0, 10)])


def test_only_served_main_calls_with_a_prompt_count_enter() -> None:
    rows = [
        {"session_id": "a", "turn": 0, "call": 0, "status": 200, "prompt_tokens": 50},
        {"session_id": "a", "turn": 0, "call": 1, "status": 200, "prompt_tokens": 60},
        {"session_id": "b", "turn": 0, "call": 0, "status": 503, "prompt_tokens": 70},
        {"session_id": "c", "turn": 1, "call": 0, "status": 200, "prompt_tokens": None},
    ]
    assert requests_of(rows) == [FloorRequest("a", 0, 50)]


@pytest.mark.parametrize(
    ("args", "applies"),
    [
        (["--workload", "sharegpt", "--rate", "2"], True),
        (["--workload=sharegpt", "--history", "dataset"], True),
        (["--workload", "sharegpt", "--history", "actual"], False),
        (["--workload", "chat"], False),
        (["--workload", "mooncake", "--trace", "day.jsonl"], False),
    ],
)
def test_the_floor_is_reported_for_the_sharegpt_replay_of_recorded_replies(
    args: list[str], applies: bool
) -> None:
    assert bench_routing.floor_applies(args) is applies


def test_a_run_is_set_beside_its_floor(tmp_path: Path) -> None:
    # Two conversations of two turns; each request took 50 ms more than its floor.
    floors = replay_floors(
        H100,
        0.25,
        [
            FloorRequest("a", 0, 1200),
            FloorRequest("a", 1, 1800),
            FloorRequest("b", 0, 200),
            FloorRequest("b", 1, 400),
        ],
    )
    rows = [
        {
            "session_id": s,
            "turn": t,
            "call": 0,
            "status": 200,
            "prompt_tokens": n,
            "ttft_s": f + 0.05,
        }
        for (s, t, n), f in zip(
            [("a", 0, 1200), ("a", 1, 1800), ("b", 0, 200), ("b", 1, 400)], floors, strict=True
        )
    ]
    rows.append({"session_id": "c", "turn": 0, "call": 0, "status": 500, "ttft_s": None})
    (tmp_path / "metrics.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    got = bench_routing.run_floor(tmp_path, "h100-llama-8b", 0.25)
    assert got is not None
    assert got["requests"] == 4
    assert got["above_p50"] == pytest.approx(50)
    assert got["above_mean"] == pytest.approx(50)
    assert got["ttft_p90"] - got["floor_p90"] == pytest.approx(50)
    assert got["floor_p50"] < got["floor_p90"] <= max(floors) * 1000
