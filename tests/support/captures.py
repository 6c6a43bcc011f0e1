"""Real vLLM 0.32 captures (tests/golden/vllm-0.32) as the proxy's stream tests read them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from proxy.stream.splice import event_data

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "vllm-0.32"


def golden_events(name: str) -> list[bytes]:
    """The capture's events, each with its closing blank line."""
    raw = (GOLDEN / name).read_bytes()
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e.strip()]


def parsed(event: bytes) -> dict[str, Any]:
    data = event_data(event)
    assert data is not None
    out: dict[str, Any] = orjson.loads(data)
    return out
