"""What a new user meets first on the command line: settings errors as one line each, the help
and the version."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from proxy.serving.cli import main


def serve_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Runs `fleet-proxy serve ...`, which must stop at its settings; returns its one line."""
    assert main(["serve", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert "listening" not in captured.out
    return lines[0]


@pytest.fixture(autouse=True)
def _no_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEET_PROXY_BACKENDS", raising=False)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            "port: 8000\nbackends: [http://a:1, http://b:1\npolicy: round_robin\n",
            ", line 3, column 7: invalid YAML: expected ',' or ']', but got ':'",
        ),
        (
            "- http://10.0.0.5:8000\n- http://10.0.0.6:8000\n",
            ": want a mapping of setting names to values (port: 8000, backends: [...]), got a list",
        ),
    ],
    ids=["malformed", "a-list"],
)
def test_a_bad_yaml_file_is_one_line_naming_it(
    text: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "fleet.yaml"
    cfg.write_text(text)
    assert serve_error(["--config", str(cfg)], capsys) == f"fleet-proxy: config file {cfg}{says}"


def test_an_empty_yaml_file_means_defaults(tmp_path: Path) -> None:
    from proxy.settings import load_settings

    cfg = tmp_path / "fleet.yaml"
    cfg.write_text("# nothing set yet\n")
    assert load_settings({}, cfg).port == 8000


def test_backends_env_that_is_not_json_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEET_PROXY_BACKENDS", "[http://10.0.0.5:8000")
    line = serve_error([], capsys)
    assert line.startswith("fleet-proxy: FLEET_PROXY_BACKENDS must be JSON (e.g. [")
    assert "Expecting value: line 1 column 2" in line


def test_serve_help_lists_every_setting_and_policy(capsys: pytest.CaptureFixture[str]) -> None:
    from policies.registry import policy_names
    from proxy.settings import Settings

    with pytest.raises(SystemExit) as done:
        main(["serve", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    listed = {
        line.split()[0] for line in out.split("\nsettings, ")[1].splitlines() if line[:2] == "  "
    }
    assert set(Settings.model_fields) <= listed
    assert "  move_kind " in out and "auto (auto|recompute|handover|precopy)" in out
    policies_line = next(line for line in out.splitlines() if line.startswith("routing policies"))
    assert policies_line.split(": ", 1)[1].split(", ") == policy_names()


def test_version_is_the_installed_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"fleet-proxy {version('fleet-proxy')}\n"


# Runs `fleet-proxy ARGS` in a fresh interpreter, its own output discarded, then prints the
# modules it imported.
IMPORTED_BY = """
import contextlib, io, sys
from proxy.serving.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit as done:
        assert done.code == 0, done.code
print(" ".join(sys.modules))
"""

# What serving, the planner and the routing policies import: a help command needs none of it.
SERVING_MODULES = {
    "kubernetes_asyncio",
    "planner",
    "httpx",
    "fastapi",
    "uvicorn",
    "prometheus_client",
    "policies.registry",
    "proxy.serving.app",
}


def imported_by(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED_BY, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


def test_help_imports_no_subcommand() -> None:
    imported = imported_by("--help")
    assert "argparse" in imported
    assert imported.isdisjoint({*SERVING_MODULES, "proxy.settings", "pydantic"})


def test_serve_help_imports_the_settings_and_nothing_that_serves() -> None:
    imported = imported_by("serve", "--help")
    assert {"proxy.settings", "policies.names"} <= imported
    assert imported.isdisjoint(SERVING_MODULES)


@pytest.mark.parametrize(
    ("argv", "usage", "says"),
    [
        (
            ["serve", "--prot", "8000"],
            "usage: fleet-proxy serve ",
            "fleet-proxy serve: error: unrecognized arguments: --prot 8000 "
            "(--prot: did you mean --port?)",
        ),
        (
            ["plan", "--proxy", "http://p:1", "--adjustment-intervall=3"],
            "usage: fleet-proxy plan ",
            "fleet-proxy plan: error: unrecognized arguments: --adjustment-intervall=3 "
            "(--adjustment-intervall: did you mean --adjustment-interval?)",
        ),
        (
            ["demo", "--engins", "2"],
            "usage: fleet-proxy demo ",
            "fleet-proxy demo: error: unrecognized arguments: --engins 2 "
            "(--engins: did you mean --engines?)",
        ),
        (
            ["serve", "--zzzz"],
            "usage: fleet-proxy serve ",
            "fleet-proxy serve: error: unrecognized arguments: --zzzz",
        ),
    ],
    ids=["serve", "plan", "demo", "nothing-close"],
)
def test_a_mistyped_flag_shows_its_subcommands_usage_and_the_closest_flag(
    argv: list[str], usage: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage)
    assert err.strip().splitlines()[-1] == says


def test_a_backend_url_without_a_scheme_names_the_value_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--backend", "127.0.0.1:8001"]) == 2
    err = capsys.readouterr().err
    assert err.count("'127.0.0.1:8001'") == 1, err
    assert (
        err.strip()
        .splitlines()[-1]
        .endswith("backend url must start with http:// or https://, got '127.0.0.1:8001'")
    )
