"""Backends from Kubernetes pods: which pods are wanted and as what (`desired_from_pods`, pure),
and `KubernetesSource`, the discovery source that keeps that set current with a `PodWatcher`.

A pod is wanted while it is Ready, not terminating and has an IP; until then, and from the
moment it starts terminating, it is left out, so it gets no requests. Its backend id is the pod
name and its `instance` the pod's uid: a recreated pod of the same name, or the same name at a
new IP, is a new backend, never the old one updated in place; a pod that gets the IP a gone pod
had is a different name and so a different backend.

What a pod's labels or annotations (a label wins) say about its backend:
- `fleet-proxy.io/role`: `prefill`, `decode` or `both` (default `both`);
- `fleet-proxy.io/node`: its failure domain's node (default: the node it runs on);
- `fleet-proxy.io/unit`: its unit (default none);
- `fleet-proxy.io/port` (annotation): the engine's port (default: the `discovery_port`);
- `fleet-proxy.io/kv-events-port` (annotation): the port the engine publishes its KV-cache
  events on (`--kv-events-config` endpoint `tcp://*:PORT`), connected to at the pod's IP;
  `fleet-proxy.io/kv-events-replay-port`: its replay socket (default none of either);
- `labels.fleet-proxy.io/KEY: VALUE` (annotations): the backend label KEY=VALUE, e.g.
  `labels.fleet-proxy.io/kv_connector: nixl`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Iterable

from fleet.discovery import KUBERNETES, Publish
from fleet.kube import KubeApi, PodInfo
from fleet.pod_watch import PodSet, PodWatcher, Sleep
from fleet.types import BackendSpec, Role

log = logging.getLogger("fleet_proxy.discovery")

PREFIX = "fleet-proxy.io/"
ROLE = PREFIX + "role"
NODE = PREFIX + "node"
UNIT = PREFIX + "unit"
PORT = PREFIX + "port"
KV_EVENTS_PORT = PREFIX + "kv-events-port"
KV_EVENTS_REPLAY_PORT = PREFIX + "kv-events-replay-port"
LABEL_PREFIX = "labels." + PREFIX


def _read(pod: PodInfo, key: str) -> str | None:
    return pod.labels.get(key) or pod.annotations.get(key) or None


def _host(ip: str) -> str:
    return f"[{ip}]" if ipaddress.ip_address(ip).version == 6 else ip


def backend_from_pod(pod: PodInfo, default_port: int) -> BackendSpec:
    """The backend a serving pod is; ValueError naming a label or annotation that is wrong."""
    if not pod.pod_ip:
        raise ValueError("no pod IP")
    role_text = _read(pod, ROLE) or Role.BOTH.value
    if role_text not in set(Role):
        raise ValueError(f"{ROLE} {role_text!r}: prefill, decode or both expected")
    port = _port(pod, PORT) or default_port
    host = _host(pod.pod_ip)
    events_port = _port(pod, KV_EVENTS_PORT)
    replay_port = _port(pod, KV_EVENTS_REPLAY_PORT)
    if replay_port is not None and events_port is None:
        raise ValueError(f"{KV_EVENTS_REPLAY_PORT} needs {KV_EVENTS_PORT}")
    labels = {
        key[len(LABEL_PREFIX) :]: value
        for key, value in pod.annotations.items()
        if key.startswith(LABEL_PREFIX) and len(key) > len(LABEL_PREFIX)
    }
    return BackendSpec(
        id=pod.name,
        url=f"http://{host}:{port}",
        role=Role(role_text),
        node=_read(pod, NODE) or pod.node_name,
        unit=_read(pod, UNIT) or "",
        labels=labels,
        source=KUBERNETES,
        instance=pod.uid,
        kv_events_endpoint=f"tcp://{host}:{events_port}" if events_port else "",
        kv_events_replay_endpoint=f"tcp://{host}:{replay_port}" if replay_port else "",
    )


def _port(pod: PodInfo, annotation: str) -> int | None:
    text = pod.annotations.get(annotation)
    if text is None:
        return None
    if not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= 65535:
        raise ValueError(f"{annotation} {text!r}: a port number expected")
    return int(text)


def desired_from_pods(
    pods: Iterable[PodInfo], default_port: int
) -> tuple[dict[str, BackendSpec], dict[str, str]]:
    """The backends of the serving pods by id, and what is wrong with each serving pod left
    out, by pod name."""
    desired: dict[str, BackendSpec] = {}
    faults: dict[str, str] = {}
    for pod in pods:
        if not pod.serving:
            continue
        try:
            desired[pod.name] = backend_from_pod(pod, default_port)
        except ValueError as e:
            faults[pod.name] = str(e)
    return desired, faults


class KubernetesSource:
    """The serving pods behind `selector` in `namespace`, kept by list-then-watch."""

    def __init__(
        self,
        kube: KubeApi,
        namespace: str,
        selector: str,
        default_port: int,
        *,
        watch_timeout_s: int = 300,
        max_backoff_s: float = 30.0,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.default_port = default_port
        self._faults: dict[str, str] = {}
        self.watcher = PodWatcher(
            kube,
            namespace,
            selector,
            watch_timeout_s=watch_timeout_s,
            sleep=sleep,
            max_backoff_s=max_backoff_s,
        )

    @property
    def name(self) -> str:
        return KUBERNETES

    async def run(self, publish: Publish) -> None:
        def changed(state: PodSet) -> None:
            desired, faults = desired_from_pods(state.pods.values(), self.default_port)
            for pod, fault in faults.items():
                if self._faults.get(pod) != fault:  # once per pod and fault, not per event
                    log.warning("pod %s is not used as a backend: %s", pod, fault)
            self._faults = faults
            publish(desired)

        self.watcher.on_change = changed
        await self.watcher.run()
