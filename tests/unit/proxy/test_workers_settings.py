"""`--workers`: its bounds, its three sources, and what a worker's exit is called."""

import signal
from pathlib import Path

import pytest

from proxy.serving.cli import main
from proxy.serving.workers import describe_exit
from proxy.settings import load_settings


@pytest.mark.parametrize("value", ["0", "65"])
def test_a_bad_workers_value_stops_start_up_naming_the_field(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", "--workers", value]) == 2
    assert "  workers: " in capsys.readouterr().err


def test_a_workers_value_that_is_no_number_is_refused_by_the_parser(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["serve", "--workers", "two"])
    assert stopped.value.code == 2
    assert "--workers" in capsys.readouterr().err


def test_a_bad_workers_value_from_the_environment_is_named(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FLEET_PROXY_WORKERS", "0")
    assert main(["serve"]) == 2
    err = capsys.readouterr().err
    assert "workers" in err and "greater than or equal to 1" in err


def test_workers_from_flag_environment_and_yaml(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert load_settings().workers == 1
    config = tmp_path / "fleet.yaml"
    config.write_text("workers: 3\npeer_sync_interval: 0.05\n")
    from_file = load_settings(None, config)
    assert (from_file.workers, from_file.peer_sync_interval) == (3, 0.05)
    monkeypatch.setenv("FLEET_PROXY_WORKERS", "4")
    assert load_settings(None, config).workers == 4
    assert load_settings({"workers": 2}, config).workers == 2


def test_exits_are_described_for_the_operator() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by SIGKILL"
