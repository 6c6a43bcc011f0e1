"""An InferencePool (the Gateway API Inference Extension's `inference.networking.k8s.io/v1`
resource) read as pod discovery's terms: the label selector of its model-server pods and the
port their engines listen on. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

GROUP = "inference.networking.k8s.io"
VERSION = "v1"
PLURAL = "inferencepools"


@dataclass(frozen=True, slots=True)
class PoolTarget:
    selector: str  # a label selector, `key=value,...`
    port: int


def pool_target(pool: Mapping[str, Any]) -> PoolTarget:
    """The pods and port an InferencePool names; ValueError saying what is missing. Its
    selector's `matchLabels` are used (v1 has no expressions); its first target port."""
    spec = pool.get("spec") or {}
    selector = spec.get("selector") or {}
    labels = selector.get("matchLabels") or {}
    if not isinstance(labels, Mapping) or not labels:
        raise ValueError("the InferencePool has no spec.selector.matchLabels")
    ports = spec.get("targetPorts") or []
    if not ports or not isinstance(ports[0], Mapping) or "number" not in ports[0]:
        raise ValueError("the InferencePool has no spec.targetPorts[0].number")
    port = int(ports[0]["number"])
    text = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return PoolTarget(text, port)
