"""`fleet-proxy bench` from the base install (`pip install -e .`, without the bench extra):
its help and a single-target run work; what needs the extra says which install brings it.
And a run in which every request failed exits non-zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.cli import main
from tests.support.processes import free_port

from .conftest import FakeServer

# Runs the CLI in a fresh interpreter where the bench extra's modules cannot be imported, as
# after `pip install -e .`.
WITHOUT_EXTRA = """
import sys

class NoExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"numpy", "matplotlib", "scipy", "ijson"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoExtra())
from proxy.serving.cli import main
sys.exit(main(sys.argv[1:]))
"""


def run_without_extra(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRA, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def chat_args(*targets: str, out: Path) -> list[str]:
    args = ["bench"]
    for t in targets:
        args += ["--target", t]
    return [
        *args,
        *("--model", "fake", "--workload", "chat", "--sessions", "4", "--turns", "1"),
        *("--system-tokens", "16", "--user-tokens", "8", "--output-tokens", "4"),
        *("--out", str(out), "--no-progress"),
    ]


def test_bench_help_needs_no_extra(tmp_path: Path) -> None:
    done = run_without_extra(["bench", "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--target" in done.stdout and "--workload" in done.stdout


def test_a_single_target_run_needs_no_extra(fake_pair: list[FakeServer], tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = run_without_extra(chat_args(fake_pair[0].url, out=out), tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["settings"]["run"]["completed"] == 4
    assert summary["settings"]["run"]["ttft_ms"]["p50"] is not None
    report = (out / "report.md").read_text()
    assert "No CDF plots" in report and "pip install -e '.[bench]'" in report
    assert not list(out.glob("*.png"))


def test_comparing_targets_without_the_extra_names_it(
    fake_pair: list[FakeServer], tmp_path: Path
) -> None:
    a, b = fake_pair
    out = tmp_path / "run"
    done = run_without_extra(chat_args(f"A={a.url}", f"B={b.url}", out=out), tmp_path)
    assert done.returncode == 2
    assert "comparing targets needs scipy" in done.stderr
    assert "pip install -e '.[bench]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert a.state.requests == 0 and not out.exists()


def test_every_request_failing_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(chat_args(f"http://127.0.0.1:{free_port()}", out=out)[1:])
    assert code == 1
    err = capsys.readouterr().err
    assert "all 4 requests failed" in err
    assert json.loads((out / "summary.json").read_text())["settings"]["run"]["errors"] == 4


def test_some_requests_failing_still_exits_zero(
    fake_pair: list[FakeServer], tmp_path: Path
) -> None:
    # Two targets, one refusing every connection: the run completes and its report counts
    # the failures; only a run in which nothing at all succeeded is an error.
    out = tmp_path / "run"
    code = main(
        chat_args(f"A={fake_pair[0].url}", f"B=http://127.0.0.1:{free_port()}", out=out)[1:]
    )
    assert code == 0
    settings = json.loads((out / "summary.json").read_text())["settings"]
    assert settings["A"]["errors"] == 0 and settings["B"]["errors"] == 4
