"""LocalConnector without starting workers: its state file and the GPU budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.types import Role
from planner.config import PlannerRole
from planner.local import LocalConnector, LocalSettings, LocalWorker
from tests.unit.planner.fake_admin import FakeAdmin


def worker(pid: int, port: int, gpus: tuple[str, ...] = ()) -> dict[str, object]:
    return {
        "id": f"planner-decode-{port}",
        "url": f"http://127.0.0.1:{port}",
        "role": "decode",
        "backend_role": "decode",
        "pid": pid,
        "port": port,
        "gpus": list(gpus),
    }


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                          capture_output=True, text=True)  # fmt: skip
    return int(proc.stdout)


def test_restart_keeps_live_workers_and_forgets_dead_ones(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    gone = dead_pid()
    state.write_text(
        json.dumps({"workers": [worker(os.getpid(), 9001, ("0",)), worker(gone, 9002)]})
    )
    connector = LocalConnector(FakeAdmin(), LocalSettings(state_file=state))
    assert [w.port for w in connector.managed()] == [9001]
    assert connector.managed()[0] == LocalWorker(
        "planner-decode-9001", "http://127.0.0.1:9001", PlannerRole.DECODE, Role.DECODE,
        os.getpid(), 9001, ("0",),
    )  # fmt: skip
    saved = json.loads(state.read_text())
    assert [w["port"] for w in saved["workers"]] == [9001]


async def test_workers_marks_managed_ones(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"workers": [worker(os.getpid(), 9001)]}))
    admin = FakeAdmin()
    admin.add("e0", Role.BOTH)
    admin.add("planner-decode-9001", Role.DECODE)
    admin.add("p0", Role.PREFILL)
    connector = LocalConnector(admin, LocalSettings(state_file=state))
    got = {w.id: w.managed for w in await connector.workers(PlannerRole.DECODE)}
    assert got == {"e0": False, "planner-decode-9001": True}
    with pytest.raises(RuntimeError, match="no prefill worker started by this planner"):
        await connector.stop_one(PlannerRole.PREFILL)


def test_gpus_handed_out_from_the_budget(tmp_path: Path) -> None:
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"workers": [worker(os.getpid(), 9001, ("0", "1"))]}))
    settings = LocalSettings(
        state_file=state, gpus=["0", "1", "2", "3", "4"], engine_num_gpu={PlannerRole.DECODE: 2}
    )
    connector = LocalConnector(FakeAdmin(), settings)
    assert connector.gpus_for(PlannerRole.DECODE) == ("2", "3")
    assert connector.gpus_for(PlannerRole.PREFILL) == ("2",)
    with pytest.raises(RuntimeError, match="GPU"):
        LocalConnector(FakeAdmin(), LocalSettings(state_file=state, gpus=["0", "1"])).gpus_for(
            PlannerRole.DECODE
        )
