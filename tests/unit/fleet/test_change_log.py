"""The fleet change log shared by worker processes, on a real file with two handles."""

from pathlib import Path

from fleet.change_log import ChangeLog


def test_every_handle_reads_every_change_in_log_order(tmp_path: Path) -> None:
    path = tmp_path / "changes.jsonl"
    a, b = ChangeLog(path), ChangeLog(path)
    p1 = a.append({"op": "drain", "id": "x", "draining": True})
    p2 = b.append({"op": "remove", "id": "y"})
    assert p1 == 0 < p2
    seen_a, seen_b = a.read_new(), b.read_new()
    assert seen_a == seen_b
    assert [pos for pos, _ in seen_a] == [p1, p2]
    assert seen_a[1][1] == {"op": "remove", "id": "y"}
    assert a.read_new() == []
    p3 = a.append({"op": "remove", "id": "z"})
    assert b.read_new() == [(p3, {"op": "remove", "id": "z"})]
    a.close()
    b.close()


def test_a_line_being_written_waits_for_its_end(tmp_path: Path) -> None:
    path = tmp_path / "changes.jsonl"
    log = ChangeLog(path)
    with path.open("ab") as f:
        f.write(b'{"op": "remove", "id": "a"}\n{"op": "rem')
    first = log.read_new()
    assert first == [(0, {"op": "remove", "id": "a"})]
    with path.open("ab") as f:
        f.write(b'ove", "id": "b"}\n')
    second = log.read_new()
    assert second == [(28, {"op": "remove", "id": "b"})]
    assert log.read_to == path.stat().st_size
    log.close()
