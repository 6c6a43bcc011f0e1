"""`bench` end to end against fake OpenAI servers on real ports: the artifact bundle."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import orjson

from bench.campaign import Campaign, CampaignPlan, Setting
from bench.cli import main
from bench.fake_openai import FakeState, start
from bench.runner import Replay, RunOptions
from bench.synthetic import chat_sessions
from tests.support.polling import eventually

from .conftest import FakeServer

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_jsonl(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines() if line]


def test_paired_chat_run_writes_the_whole_bundle(
    fake_pair: list[FakeServer], tmp_path: Path
) -> None:
    a, b = fake_pair
    out = tmp_path / "run"
    code = main(
        [
            "--target",
            f"A={a.url}",
            "--target",
            f"B={b.url}",
            "--router-setting",
            "A:policy=round_robin",
            "--router-setting",
            "B:policy=lmetric",
            "--workload",
            "chat",
            "--sessions",
            "4",
            "--turns",
            "3",
            "--system-tokens",
            "64",
            "--user-tokens",
            "16-32",
            "--output-tokens",
            "5-9",
            "--concurrency",
            "2",
            "--repeat",
            "2",
            "--slo",
            "ttft:60000",
            "tpot:60000",
            "--backend-metrics",
            a.url,
            b.url,
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0

    config = json.loads((out / "config.json").read_text())
    assert config["workload"]["name"] == "chat" and config["workload"]["requests"] == 12
    assert config["targets"][1] == {
        "name": "B",
        "url": b.url,
        "router_settings": {"policy": "lmetric"},
    }
    assert "commit" in config["git"] and config["model"] == "fake"

    records = read_jsonl(out / "metrics.jsonl")
    assert len(records) == 4 * 12  # 2 settings x 2 repeats x 12 requests
    assert [r["setting"] for r in records[:12]] == ["A"] * 12  # runs alternate A B A B
    assert [(r["setting"], r["repeat"]) for r in records[12::12]] == [("B", 0), ("A", 1), ("B", 1)]
    for r in records:
        assert r["error"] is None
        assert r["backend"] == (a.state.backend_id if r["setting"] == "A" else b.state.backend_id)
        assert r["usage_reported"] and 5 <= r["completion_tokens"] <= 9
        assert len(r["itl_s"]) == r["completion_tokens"] - 1  # one token per fake chunk
        assert 0 < r["ttft_s"] <= r["e2e_s"]
        assert r["prompt_tokens"] == r["est_prompt_tokens"]  # the fake counts chars / 4

    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is False
    assert set(summary["settings"]) == {"A", "B"} and len(summary["runs"]) == 4
    assert all(r["complete"] for r in summary["runs"])
    run0 = summary["runs"][0]
    assert run0["slo"]["attainment"] == 1.0 and run0["completed"] == 12
    # Turns 2 and 3 of each chat resend the earlier turns: the backend saw prefix hits.
    assert run0["backend_metrics"]["prefix_hits"] > 0
    assert run0["balance"]["backends"][a.state.backend_id]["requests"] == 12
    rows = {r["metric"]: r for r in summary["comparison"]["vs"]["B"]}
    assert rows["TTFT p50 ms"]["n"] == 2 and rows["TTFT p50 ms"]["ci_low"] is not None

    snaps = sorted(p.name for p in (out / "backend_metrics" / "B-1").iterdir())
    assert len(snaps) == 4 and all(n.endswith(".prom") for n in snaps)
    for png in ("ttft_cdf.png", "e2e_cdf.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
    report = (out / "report.md").read_text()
    assert "| A |" in report and "| B |" in report and "95% CI" in report


def test_salted_runs_do_not_inherit_each_others_cache(
    fake_pair: list[FakeServer], tmp_path: Path
) -> None:
    a, _ = fake_pair
    args = [
        "--target",
        a.url,
        "--workload",
        "chat",
        "--sessions",
        "2",
        "--turns",
        "1",
        "--system-tokens",
        "0",
        "--user-tokens",
        "64",
        "--output-tokens",
        "2",
        "--repeat",
        "2",
        "--backend-metrics",
        a.url,
        "--no-progress",
    ]
    assert main([*args, "--out", str(tmp_path / "salted")]) == 0
    assert main([*args, "--isolate", "none", "--out", str(tmp_path / "same")]) == 0
    salted = json.loads((tmp_path / "salted" / "summary.json").read_text())["runs"]
    same = json.loads((tmp_path / "same" / "summary.json").read_text())["runs"]
    # Single-turn sessions of fresh text: no hits, unless a run replays the previous run's text.
    assert [r["backend_metrics"]["prefix_hits"] for r in salted] == [0, 0]
    assert same[1]["backend_metrics"]["prefix_hits"] > 0


def test_mooncake_trace_over_completions_keeps_lengths_and_sharing(
    fake_pair: list[FakeServer], tmp_path: Path
) -> None:
    a, _ = fake_pair
    trace = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [7, 8, 9]},
        {"timestamp": 200, "input_length": 1500, "output_length": 4, "hash_ids": [7, 8, 10]},
        {"timestamp": 400, "input_length": 100, "output_length": 2, "hash_ids": [11]},
    ]
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "mc"
    code = main(
        [
            "--target",
            a.url,
            "--workload",
            "mooncake",
            "--trace",
            str(trace),
            "--speed",
            "20",
            "--api",
            "completions",
            "--backend-metrics",
            a.url,
            "--out",
            str(out),
            "--no-progress",
        ]
    )
    assert code == 0
    records = sorted(read_jsonl(out / "metrics.jsonl"), key=lambda r: str(r["session_id"]))
    # A one-turn completion sends the synthesized text as is: the trace's exact lengths.
    assert [r["prompt_tokens"] for r in records] == [1100, 1500, 100]
    assert [r["completion_tokens"] for r in records] == [3, 4, 2]
    summary = json.loads((out / "summary.json").read_text())
    bm = summary["runs"][0]["backend_metrics"]
    # Only the second request re-sends earlier blocks: 7 and 8, 2 x 512 tokens.
    assert bm["prefix_hits"] == 1024
    assert json.loads((out / "config.json").read_text())["load"]["arrival"] == "trace"


async def test_interrupted_campaign_writes_what_it_collected(tmp_path: Path) -> None:
    # A slow backend: 200 ms between tokens, so the run is still going when it is cancelled.
    state = FakeState("slow", itl_s=0.2)
    runner, port = await start(state)
    try:
        plan = CampaignPlan(
            settings=[Setting("A", f"http://127.0.0.1:{port}")],
            make_workload=lambda i: chat_sessions(
                sessions=6,
                turns=(1, 1),
                system_tokens=0,
                user_tokens=(8, 8),
                output_tokens=(1, 1) if i else (50, 50),
            ),
            options=RunOptions(base_url="", model="fake", mode="closed", concurrency=3),
            out_dir=tmp_path,
            repeat=2,
            progress=False,
        )
        campaign = Campaign(plan)
        task = asyncio.create_task(campaign.run())
        await eventually(
            lambda: state.requests >= 3, what="all three workers with a request in flight"
        )
        task.cancel()
        summary = await task
    finally:
        await runner.cleanup()
    assert summary["interrupted"] is True
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert len(records) == 3 and all(r["error"] == "cancelled" for r in records)
    run = json.loads((tmp_path / "summary.json").read_text())["runs"][0]
    assert run["errors"] == 3 and run["complete"] is False
    assert "Interrupted" in (tmp_path / "report.md").read_text()


async def test_history_modes_resend_the_dataset_or_the_served_reply(tmp_path: Path) -> None:
    state = FakeState("h", keep_prompts=True)
    runner, port = await start(state)
    try:
        workload = chat_sessions(
            sessions=1, turns=(2, 2), system_tokens=0, user_tokens=(8, 8), output_tokens=(3, 3)
        )
        turn0 = workload.sessions[0].turns[0]
        for history in ("dataset", "actual"):
            state.prompts.clear()
            opts = RunOptions(
                base_url=f"http://127.0.0.1:{port}",
                model="fake",
                mode="closed",
                concurrency=1,
                history=history,
            )
            await Replay(opts, history, 0, lambda r: None).run(workload)
            second = state.prompts[1]
            reply = turn0.reply if history == "dataset" else "tok " * 3  # what the fake served
            assert second.startswith(turn0.user + reply)
    finally:
        await runner.cleanup()
