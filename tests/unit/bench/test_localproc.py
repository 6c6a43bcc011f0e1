"""The benchmark scripts' wait for a child's HTTP endpoint notices the child's exit at once and
shows its last log lines, rather than waiting out its limit on a process already gone."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.processes import free_port

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "localproc.py"


def load_localproc() -> ModuleType:
    spec = importlib.util.spec_from_file_location("localproc", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_child_that_died_ends_the_wait_with_its_last_lines(tmp_path: Path) -> None:
    localproc = load_localproc()
    log = tmp_path / "child.log"
    said = "; ".join(f"print('line {i}')" for i in range(12))
    cmd = [sys.executable, "-c", f"{said}; raise SystemExit(3)"]
    with localproc.process(cmd, log) as child:
        child.wait(timeout=30)
        with pytest.raises(localproc.ChildExited) as ended:
            # A limit the old wait would have spent in full before a bare "never answered".
            localproc.wait_http(f"http://127.0.0.1:{free_port()}/health", 30, proc=child, log=log)
    message = str(ended.value)
    assert "exited with 3 before http://127.0.0.1:" in message
    assert message.endswith("\n".join(f"line {i}" for i in range(2, 12)))
    assert "line 1\n" not in message  # the last ten lines only
