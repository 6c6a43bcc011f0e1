"""Session fixtures of the real-vLLM tier (see tier.py for what they read)."""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import pytest

from tests.real_vllm.tier import (
    HOW_TO_KV_EVENTS,
    Proxy,
    Tier,
    load_tier,
    start_proxy,
    state_file,
    unavailable,
)

PROXY_LOG_LINES = 80


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failed test's report carries the end of each proxy log in its tmp_path: a proxy
    that dropped a connection or exited says why there, and CI keeps only the report."""
    report: pytest.TestReport = yield
    tmp_path = item.funcargs.get("tmp_path") if isinstance(item, pytest.Function) else None
    if report.failed and isinstance(tmp_path, Path):
        for log in sorted(tmp_path.glob("proxy-*.log")):
            lines = log.read_text(errors="replace").splitlines()[-PROXY_LOG_LINES:]
            report.sections.append((f"{log.name} (last {len(lines)} lines)", "\n".join(lines)))
    return report


@pytest.fixture(scope="session")
def tier() -> Tier:
    """Two ordinary engines with prefix caching (engines.py start)."""
    t = load_tier(state_file("FLEET_VLLM_STATE", "state.json"), "aggregated")
    if len(t.engines) < 2:
        pytest.skip("the tier runs fewer than 2 engines; start it with --count 2")
    return t


@pytest.fixture(scope="session")
def kv_events_tier(tier: Tier) -> Tier:
    """The ordinary pair, started with KV-cache events (engines.py start --kv-events)."""
    if tier.kv_events_topic is None or any(e.kv_events_endpoint is None for e in tier.engines):
        unavailable(
            f"the tier's engines publish no KV-cache events; {HOW_TO_KV_EVENTS}", "aggregated"
        )
    return tier


@pytest.fixture(scope="session")
def pd_tier() -> Tier:
    """One prefill and one decode engine with NixlConnector (engines.py start --pd-nixl)."""
    return load_tier(state_file("FLEET_VLLM_PD_STATE", "pd-state.json"), "pd_nixl")


@pytest.fixture(scope="session")
def pooling_tier() -> Tier:
    """One engine running the model as an embedding model under its own name, beside the
    ordinary pair (engines.py start --pooling --state .../pooling-state.json)."""
    t = load_tier(state_file("FLEET_VLLM_POOLING_STATE", "pooling-state.json"), "pooling")
    if t.pooling != "embed":
        unavailable(f"the pooling engine runs {t.pooling!r}, not 'embed'", "pooling")
    return t


@pytest.fixture(scope="session")
def proxy_for(
    tier: Tier, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str], Proxy]]:
    """`fleet-proxy serve` in front of the tier's engines, one process per policy name."""
    log_dir: Path = tmp_path_factory.mktemp("proxy-logs")
    started: dict[str, Proxy] = {}

    def get(policy: str) -> Proxy:
        if policy not in started:
            started[policy] = start_proxy(tier, policy, log_dir)
        return started[policy]

    yield get
    for p in started.values():
        p.stop()


@pytest.fixture
def proxy(proxy_for: Callable[[str], Proxy]) -> Proxy:
    return proxy_for("round_robin")
