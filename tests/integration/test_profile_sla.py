"""`fleet-proxy profile-sla` end to end against the simulator on a real port, and its errors."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.image import imread

from planner.profile_file import load_profile, read_profile_file
from planner.profile_sla import main
from planner.sla_plots import DECODE_PNG, PREFILL_PNG

SLA_FLAGS = ["--isl", "256", "--osl", "32", "--ttft", "1", "--itl", "0.05"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "argv",
    [
        ["--osl", "32", "--ttft", "1", "--itl", "0.05", "--sim"],  # no --isl
        [*SLA_FLAGS[:6], "--itl", "-1", "--sim"],
        [*SLA_FLAGS, "--url", "http://127.0.0.1:1", "--sim", "cpu-tiny"],
        [*SLA_FLAGS, "--sim", "--isl-factors", "1,x"],
        [*SLA_FLAGS],  # neither --url nor --sim
    ],
)
def test_bad_flags_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("fleet-proxy profile-sla: ")


def test_unknown_sim_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SLA_FLAGS, "--out", str(tmp_path / "p.json"), "--sim", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown profile 'nope'" in err


def test_unreachable_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    out = tmp_path / "p.json"
    assert main([*SLA_FLAGS, "--out", str(out), "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cannot reach {url}/v1/models" in err
    assert not out.exists()


@pytest.mark.slow
def test_profiles_the_simulator(tmp_path: Path) -> None:
    out, plots = tmp_path / "profile.json", tmp_path / "plots"
    cmd = [sys.executable, "-m", "proxy.serving.cli", "profile-sla", *SLA_FLAGS]
    cmd += ["--out", str(out), "--plots", str(plots), "--sim", "cpu-tiny"]
    cmd += ["--isl-factors", "0.5,1,2", "--context-factors", "1", "--max-in-flight", "4"]
    cmd += ["--repeats", "2", "--decode-tokens", "16", "--request-timeout", "30"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Suggested prefill config: cpu-tiny (TTFT " in done.stdout
    assert "Suggested planner upper/lower bound for decode kv cache utilization: " in done.stdout

    data = read_profile_file(out)
    assert (data.chosen_prefill, data.chosen_decode) == ("cpu-tiny", "cpu-tiny")
    (config,) = data.configs
    assert config.num_gpu == 1
    # The simulator's prefill step time grows with every prompt token.
    isls = [x for x, _ in config.prefill.points]
    ttfts = [y for _, y in config.prefill.points]
    assert isls == [128, 256, 512]
    assert ttfts[0] < ttfts[-1] and ttfts[1] < ttfts[-1]
    # cpu-tiny: 1024 blocks of 128 tokens; one context, ISL + OSL/2 = 272
    assert config.decode.kv_tokens == 131072
    ((context, curve),) = config.decode.curves
    assert context == 272
    assert [n for n, _ in curve] == [1, 2, 4]
    assert all(0 < itl < 1 for _, itl in curve)
    profiles = load_profile(out)
    assert profiles.prefill.ttft(256) == pytest.approx(ttfts[1])

    for name in (PREFILL_PNG, DECODE_PNG):
        assert (plots / name).read_bytes().startswith(PNG_MAGIC)
        height, width, _ = imread(plots / name).shape
        assert height > 100 and width > 100


@pytest.mark.slow
def test_an_engine_started_with_an_api_key(tmp_path: Path) -> None:
    """As `vllm serve --api-key`: measured with `--api-key`, refused in one line without it."""
    sim = subprocess.Popen(
        [sys.executable, "-m", "proxy.serving.cli", "sim", "--base-port=0", "--api-key=k-123"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert sim.stdout is not None
        url = sim.stdout.readline().strip()  # printed once it listens
        assert url.startswith("http://127.0.0.1:"), url
        cmd = [sys.executable, "-m", "proxy.serving.cli", "profile-sla", *SLA_FLAGS, "--url", url]
        cmd += ["--isl-factors", "1", "--context-factors", "1", "--max-in-flight", "2"]
        cmd += ["--repeats", "1", "--decode-tokens", "8", "--request-timeout", "30"]
        refused = subprocess.run(
            [*cmd, "--out", str(tmp_path / "no.json")], capture_output=True, text=True, timeout=60
        )
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "401" in refused.stderr and not (tmp_path / "no.json").exists()
        out = tmp_path / "p.json"
        done = subprocess.run(
            [*cmd, "--out", str(out), "--api-key", "k-123"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert read_profile_file(out).configs[0].prefill.points[0][0] == 256
    finally:
        sim.terminate()
        sim.wait(timeout=15)
