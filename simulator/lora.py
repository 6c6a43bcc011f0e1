"""LoRA adapters of a simulated engine, as `vllm serve --lora-modules NAME=PATH --max-loras N`
configures them, and as `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True` lets clients load and unload
them while it runs (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`).

An adapter is a model name the engine serves on top of its base model: /v1/models lists it
(with its path as `root` and the base model as `parent`), requests may name it, and its
requests share no prefix-cache blocks with other adapters' (vLLM salts block hashes with the
adapter). At most `max_loras` distinct adapters run in one batch; a waiting request for
another adapter is skipped until a slot frees. `vllm:lora_requests_info` reports, at every
engine step, the adapters of running and of waiting requests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from prometheus_client import CollectorRegistry, Gauge


@dataclass(frozen=True, slots=True)
class LoraConfig:
    adapters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    max_loras: int = 1  # vLLM's default
    # vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING (with --enable-lora): the load/unload routes.
    runtime_updates: bool = False

    @property
    def enabled(self) -> bool:
        return bool(self.adapters) or self.runtime_updates

    def adapter_id(self, name: str) -> int:
        """The adapter's integer id as vLLM numbers adapters loaded at start-up: 1, 2, ... in
        the order given (what its KV events carry as `lora_id`)."""
        return list(self.adapters).index(name) + 1


def parse_lora_modules(
    specs: Iterable[str], max_loras: int = 1, runtime_updates: bool = False
) -> LoraConfig:
    """`NAME=PATH` entries (vLLM's plain form of --lora-modules) -> LoraConfig."""
    adapters: dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora-modules takes NAME=PATH, got {spec!r}")
        adapters[name] = path
    if max_loras < 1:
        raise ValueError("--max-loras must be at least 1")
    return LoraConfig(MappingProxyType(adapters), max_loras, runtime_updates)


class AdapterError(Exception):
    """A load or unload vLLM refuses: `status` and its message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class AdapterTable:
    """The adapters an engine serves now: those of its start-up, and those loaded since.

    Ids are vLLM's: start-up adapters 1, 2, ... in order, each later load the next number
    (never reused, as vLLM's counter)."""

    def __init__(self, config: LoraConfig) -> None:
        self.paths: dict[str, str] = dict(config.adapters)
        self._ids = {name: i + 1 for i, name in enumerate(config.adapters)}
        self._next_id = len(self._ids) + 1

    def adapter_id(self, name: str) -> int:
        return self._ids[name]

    def load(self, name: str, path: str) -> None:
        if name in self.paths:
            raise AdapterError(400, f"The lora adapter '{name}' has already been loaded.")
        self.paths[name] = path
        self._ids[name] = self._next_id
        self._next_id += 1

    def unload(self, name: str) -> None:
        if name not in self.paths:
            raise AdapterError(404, f"The lora adapter '{name}' cannot be found.")
        del self.paths[name]
        del self._ids[name]


class LoraInfoGauge:
    """vllm:lora_requests_info as vLLM declares it: no model or engine label, one series per
    label combination ever reported, each set to the time of its last report."""

    def __init__(self, registry: CollectorRegistry, max_loras: int) -> None:
        self._gauge = Gauge(
            "vllm:lora_requests_info",
            "Running stats on lora requests.",
            ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
            registry=registry,
            multiprocess_mode="sum",
        )
        self._max = str(max_loras)

    def report(self, running: Sequence[str], waiting: Sequence[str]) -> None:
        self._gauge.labels(self._max, ",".join(waiting), ",".join(running)).set_to_current_time()
