"""Pod discovery's settings: defaults, environment, flags, refusals; and that only the first of
several workers runs discovery."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.peer_load import PeerLayout, PeerSegment
from proxy.control.peer_sync import WorkerSeat
from proxy.serving.app import create_app
from proxy.serving.cli import build_settings
from proxy.settings import ConfigError, load_settings
from tests.unit.proxy.test_planner_settings import serve_args


def test_defaults() -> None:
    s = load_settings()
    assert s.discovery_kubernetes is False
    assert s.discovery_namespace is None and s.discovery_kubeconfig is None
    assert s.discovery_label_selector == "fleet-proxy.io/model"
    assert (s.discovery_port, s.discovery_drain_timeout) == (8000, 60.0)


def test_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEET_PROXY_DISCOVERY_KUBERNETES", "true")
    monkeypatch.setenv("FLEET_PROXY_DISCOVERY_NAMESPACE", "llm")
    monkeypatch.setenv("FLEET_PROXY_DISCOVERY_LABEL_SELECTOR", "app=vllm")
    monkeypatch.setenv("FLEET_PROXY_DISCOVERY_PORT", "8080")
    s = load_settings()
    assert s.discovery_kubernetes is True
    assert (s.discovery_namespace, s.discovery_label_selector, s.discovery_port) == (
        "llm",
        "app=vllm",
        8080,
    )


def test_flags(tmp_path: Path) -> None:
    s = build_settings(
        serve_args(
            "--discovery-kubernetes",
            "--discovery-namespace",
            "llm",
            "--discovery-label-selector",
            "app=vllm",
            "--discovery-port",
            "9000",
            "--discovery-kubeconfig",
            str(tmp_path / "kubeconfig"),
            "--discovery-drain-timeout",
            "5",
        )
    )
    assert s.discovery_kubernetes is True
    assert (s.discovery_namespace, s.discovery_label_selector) == ("llm", "app=vllm")
    assert (s.discovery_port, s.discovery_drain_timeout) == (9000, 5.0)
    assert s.discovery_kubeconfig == tmp_path / "kubeconfig"
    assert build_settings(serve_args()).discovery_kubernetes is False


@pytest.mark.parametrize(
    ("field", "value"), [("discovery_port", 0), ("discovery_drain_timeout", 0)]
)
def test_refused(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        load_settings({field: value})


async def test_a_kubeconfig_that_cannot_be_loaded_stops_start_up(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    s = load_settings({"discovery_kubernetes": True, "discovery_kubeconfig": missing})
    app = create_app(s)
    with pytest.raises(ValueError, match=r"discovery_kubeconfig .*nope: no such file"):
        async with app.control_app.router.lifespan_context(app.control_app):
            pass


async def test_only_the_first_worker_discovers(tmp_path: Path) -> None:
    # The kubeconfig is missing: the worker that discovers fails to start, the other starts.
    s = load_settings({"discovery_kubernetes": True, "discovery_kubeconfig": tmp_path / "nope"})
    segment = PeerSegment(PeerLayout(workers=2, slots=8))
    try:
        for index in (1, 0):
            seat = WorkerSeat(index, 2, segment.name, str(tmp_path / "changes.jsonl"))
            app = create_app(s, seat=seat)
            lifespan = app.control_app.router.lifespan_context(app.control_app)
            if index == 1:
                async with lifespan:
                    assert app.control_app.state.discovery is None
            else:
                with pytest.raises(ValueError, match=r"discovery_kubeconfig .*nope: no such file"):
                    async with lifespan:
                        pass
    finally:
        segment.close()
