"""The endpoint picker's own options (`fleet-proxy epp`'s flags), beside the fleet and
routing settings it shares with `serve`."""

from __future__ import annotations

from dataclasses import dataclass, field

from proxy.gateway.shedding import Shedding


@dataclass(frozen=True, slots=True)
class EppOptions:
    host: str = "127.0.0.1"
    port: int = 9002  # the port the Gateway API Inference Extension's EPP listens on
    fallbacks: int = 0  # engines named after the primary in the destination
    metrics_port: int | None = None
    shedding: Shedding = field(default_factory=Shedding)
    # The InferencePool whose pods are the engines (found with pod discovery), and its
    # namespace (None: discovery_namespace, else the pod's own, else `default`).
    pool_name: str | None = None
    pool_namespace: str | None = None
    pool_poll_s: float = 10.0  # seconds between lists of the pool when its watch fails
