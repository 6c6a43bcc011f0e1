"""A benchmark script's child processes end with it, however it ends: a killed campaign must
not leave its simulators and proxies running (scripts/localproc.py, scripts/compare_peers.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support.polling import eventually_blocking

REPO = Path(__file__).resolve().parents[3]

PARENT = """
import sys, time
from pathlib import Path
sys.path.insert(0, {scripts!r})
from localproc import process
with process(["sleep", "60"], Path({log!r})) as child:
    print(child.pid, flush=True)
    time.sleep(60)
"""


def _gone(pid: int) -> bool:
    """Ended: no such process, or a zombie waiting for init to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_killed_script_takes_its_child_with_it(tmp_path: Path) -> None:
    code = PARENT.format(scripts=str(REPO / "scripts"), log=str(tmp_path / "child.log"))
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert not _gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        eventually_blocking(lambda: _gone(child), 10, "the child ended with its parent", 0.05)
    finally:
        if not _gone(child):
            os.kill(child, signal.SIGKILL)
