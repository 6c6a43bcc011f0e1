"""scripts/bench_responses.py sends the same threads both ways: by `previous_response_id`
(the proxy expands the thread) or with the whole history as input; and it tabulates runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import orjson

SCRIPTS = Path(__file__).resolve().parents[3] / "scripts"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_responses", SCRIPTS / "bench_responses.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def test_one_seed_makes_the_same_threads_for_both_ways() -> None:
    b = load()
    one, two = b.threads_of(7, 3, 4, 20), b.threads_of(7, 3, 4, 20)
    assert [(t.opening, t.questions) for t in one] == [(t.opening, t.questions) for t in two]
    assert len(one[0].opening.split()) == 20 and len(one[0].questions) == 4
    assert b.threads_of(8, 3, 4, 20)[0].opening != one[0].opening


def test_a_turn_sends_its_message_and_the_thread_the_way_asked() -> None:
    b = load()
    (expand,) = b.threads_of(1, 1, 2, 5)
    first = b.turn_body("expand", expand, 0, 8)
    assert first["input"][0]["content"].startswith(expand.opening)
    assert "previous_response_id" not in first and first["stream"] is True
    expand.previous_id = "resp_1"
    second = b.turn_body("expand", expand, 1, 8)
    assert second["previous_response_id"] == "resp_1"
    assert second["input"] == [{"role": "user", "content": expand.questions[1]}]

    (full,) = b.threads_of(1, 1, 2, 5)
    b.turn_body("full", full, 0, 8)
    answer = {"type": "message", "role": "assistant", "content": [{"type": "output_text"}]}
    full.history.append(answer)
    again = b.turn_body("full", full, 1, 8)
    assert again["store"] is False and "previous_response_id" not in again
    assert again["input"][1:] == [answer, {"role": "user", "content": full.questions[1]}]


def test_runs_are_summed_per_way(tmp_path: Path) -> None:
    b = load()
    run = {
        "turns": [
            {"thread": 0, "index": 0, "ttft_s": 0.010, "ok": True, "error": ""},
            {"thread": 0, "index": 1, "ttft_s": 0.020, "ok": True, "error": ""},
            {"thread": 1, "index": 0, "ttft_s": None, "ok": False, "error": "HTTP 500: x"},
        ],
        "skipped": 1,
        "proxy_cpu_s": 0.03,
        "wall_s": 1.5,
        "load_before": [1.0, 1.0, 1.0],
        "load_after": [2.0, 1.0, 1.0],
    }
    path = tmp_path / "expand-0.json"
    path.write_bytes(orjson.dumps(run))
    s = b.summary([path])
    assert (s["requests"], s["failed"], s["skipped"]) == (3, 1, 1)
    assert s["later_turns_ttft_p50_ms"] == 20.0
    assert round(s["proxy_cpu_ms_per_request"], 6) == 10.0
    assert s["errors"] == ["HTTP 500: x"] and s["load"] == [(1.0, 2.0)]
