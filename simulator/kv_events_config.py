"""`--kv-events-config`: the JSON object `vllm serve` takes, with the same keys and defaults.

    {"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
     "replay_endpoint": "tcp://*:5558", "topic": "kv"}

An endpoint with a wildcard host (or ipc/inproc) is bound, any other is connected to, as in
vLLM. One difference: the simulator binds a wildcard on its own listen address (`--host`,
127.0.0.1 by default), never on every interface. Engine i of a fleet takes the ports plus i,
as vLLM's data-parallel ranks do; port 0 asks the system for a free port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fleet.kv_events import is_bind_endpoint


class KvEventsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None  # None: zmq when enabled
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = Field(10_000, ge=1)  # batches kept for replay
    hwm: int = Field(100_000, ge=0)  # the PUB socket's send high-water mark
    # vLLM's queue between scheduler and publisher thread; the simulator publishes from its
    # step loop directly, so this bound is accepted and has nothing to limit.
    max_queue_size: int = Field(100_000, ge=1)
    topic: str = ""

    @property
    def publishes(self) -> bool:
        kind = self.publisher or ("zmq" if self.enable_kv_cache_events else "null")
        return self.enable_kv_cache_events and kind == "zmq"

    def for_engine(self, index: int, host: str) -> EngineEndpoints:
        """Engine `index`'s sockets: ports shifted by the index, wildcards bound on `host`."""
        endpoint = _offset(self.endpoint, index)
        replay = None if self.replay_endpoint is None else _offset(self.replay_endpoint, index)
        return EngineEndpoints(
            publish=_local(endpoint, host),
            publish_binds=is_bind_endpoint(endpoint),
            replay=None if replay is None else _local(replay, host),  # always bound, as in vLLM
        )


@dataclass(frozen=True, slots=True)
class EngineEndpoints:
    publish: str
    publish_binds: bool
    replay: str | None


def parse_kv_events_config(text: str) -> KvEventsConfig:
    """The flag's JSON; ValueError saying what is wrong."""
    try:
        return KvEventsConfig.model_validate(orjson.loads(text))
    except orjson.JSONDecodeError as e:
        raise ValueError(f"--kv-events-config is not JSON: {e}") from None
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '(config)'}: {err['msg']}"
            for err in e.errors()
        )
        raise ValueError(f"--kv-events-config: {problems}") from None


def _offset(endpoint: str, index: int) -> str:
    if index == 0 or not endpoint.startswith("tcp://"):
        return endpoint if index == 0 else f"{endpoint}_{index}"
    base, _, port = endpoint.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"no port in KV-events endpoint {endpoint!r}")
    return endpoint if int(port) == 0 else f"{base}:{int(port) + index}"


def _local(endpoint: str, host: str) -> str:
    """A wildcard tcp address bound on `host` instead of on every interface."""
    if not endpoint.startswith("tcp://") or not is_bind_endpoint(endpoint):
        return endpoint
    _, _, port = endpoint.rpartition(":")
    bracketed = f"[{host}]" if ":" in host else host
    return f"tcp://{bracketed}:{port}"
