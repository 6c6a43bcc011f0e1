"""Which backend URLs the admin API may add at run time."""

from __future__ import annotations

import pytest

from proxy.settings import Settings
from proxy.url_policy import (
    UrlPolicy,
    is_loopback,
    parse_allow_entry,
    refuse_kv_events_reason,
    refuse_reason,
)


def default_policy(**extra: object) -> UrlPolicy:
    s = Settings(**extra)  # type: ignore[arg-type]
    return UrlPolicy.build(
        s.backend_url_allow, s.backend_url_schemes, s.backend_url_allow_link_local
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8001",
        "http://10.1.2.3:8000",
        "https://192.168.0.9",
        "http://[::1]:8000",
        "http://localhost:8000",  # resolves to loopback only
    ],
)
async def test_default_allows_loopback_and_private_addresses(url: str) -> None:
    assert await refuse_reason(default_policy(), url) is None


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://[fe80::1]:80", "link-local"),
        ("http://[::ffff:169.254.169.254]", "link-local"),
        ("http://8.8.8.8:80", "not inside backend_url_allow"),
        ("http://0.0.0.0:8000", "never a backend"),
        ("http://224.0.0.1", "never a backend"),
        ("http://user:pw@127.0.0.1:8000", "credentials"),
        ("ftp://127.0.0.1", "scheme"),
        ("http://127.0.0.1:99999", "port"),
        ("http://no-such-host.invalid", "does not resolve"),
    ],
)
async def test_refused(url: str, why: str) -> None:
    reason = await refuse_reason(default_policy(), url)
    assert reason is not None and why in reason


async def test_link_local_only_when_allowed_on_purpose() -> None:
    policy = default_policy(backend_url_allow_link_local=True)
    assert await refuse_reason(policy, "http://169.254.10.10:8000") is None


async def test_name_patterns_allow_names_without_resolving_them() -> None:
    policy = default_policy(backend_url_allow=["*.svc.cluster.local"])
    assert await refuse_reason(policy, "http://vllm-0.vllm.svc.cluster.local:8000") is None
    # An address still needs a CIDR: the pattern list alone allows no address.
    assert await refuse_reason(policy, "http://127.0.0.1:8000") is not None


async def test_schemes_can_be_narrowed() -> None:
    policy = default_policy(backend_url_schemes=["https"])
    reason = await refuse_reason(policy, "http://127.0.0.1:8000")
    assert reason is not None and "scheme" in reason


def test_allow_entries_are_checked_at_start_up() -> None:
    assert str(parse_allow_entry("10.0.0.0/8")) == "10.0.0.0/8"
    assert parse_allow_entry("VLLM-*") == "vllm-*"
    with pytest.raises(ValueError):
        parse_allow_entry("http://x")
    with pytest.raises(ValueError):
        Settings(backend_url_allow=["not a cidr"])


def test_loopback_clients() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("::ffff:127.0.0.1")
    assert not is_loopback("10.0.0.1") and not is_loopback("testclient")


@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("tcp://127.0.0.1:5557", None),
        ("tcp://[::1]:5557", None),
        ("tcp://10.0.0.5:5558", None),
        ("tcp://8.8.8.8:5557", "not inside backend_url_allow"),
        ("tcp://169.254.169.254:5557", "link-local"),
        ("ipc:///run/engine.sock", "only tcp://"),
    ],
)
async def test_kv_events_endpoints_added_at_run_time_pass_as_backend_hosts(
    endpoint: str, why: str | None
) -> None:
    refused = await refuse_kv_events_reason(default_policy(), endpoint)
    assert refused is None if why is None else why in (refused or "")
