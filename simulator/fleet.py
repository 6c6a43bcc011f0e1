"""Start a fleet of simulated engines inside the caller's running event loop.

    async with await start_fleet(3, profile="cpu-tiny", speed=10) as fleet:
        fleet.urls            # ["http://127.0.0.1:41233", ...]
        fleet.engines[0].engine.core.running     # scheduler state
        await fleet.engines[1].crash()           # or set fleet.engines[1].faults

All engines of one fleet share a tokenizer (its tables take a fraction of a second to build)
and an engine clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import TracebackType

from fleet.types import Role
from simulator.engine import Engine
from simulator.kv_events_config import KvEventsConfig
from simulator.kv_publisher import KvEventPublisher
from simulator.lora import LoraConfig
from simulator.profiles import DEFAULT_PROFILE, Profile, load_profile
from simulator.server import EngineServer
from simulator.simtime import ScaledTime, SimTime
from simulator.tokenizer import Tokenizer

DEFAULT_MODEL = "sim-llama-8b"


class SimFleet:
    def __init__(self, engines: list[EngineServer]) -> None:
        self.engines = engines

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.engines]

    def by_role(self, role: Role) -> list[EngineServer]:
        return [e for e in self.engines if e.role == role]

    async def close(self) -> None:
        for e in self.engines:
            await e.close()

    async def __aenter__(self) -> SimFleet:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


async def start_fleet(
    engines: int = 1,
    *,
    base_port: int = 0,
    host: str = "127.0.0.1",
    profile: str | Profile = DEFAULT_PROFILE,
    role: Role | str | Sequence[Role | str] = Role.BOTH,
    speed: float = 1.0,
    model: str = DEFAULT_MODEL,
    time: SimTime | None = None,
    tokenizer: Tokenizer | None = None,
    api_key: str | None = None,
    lora: LoraConfig | None = None,
    kv_events: KvEventsConfig | None = None,
) -> SimFleet:
    """Start `engines` engines on ports base_port, base_port+1, ... (0: ephemeral ports).

    `role` is one role for all engines or one per engine; every engine can act on both sides
    of a P/D transfer (kv_both), the role is what the fleet reports for routing. `api_key`:
    each engine requires it on /v1/*, as `vllm serve --api-key` does. `lora`: the LoRA
    adapters every engine serves (`--lora-modules`, `--max-loras`). `kv_events`: the
    engines publish their KV-cache events (`--kv-events-config`), engine i on the configured
    ports plus i (its `kv_publisher` has the addresses bound).
    """
    prof = profile if isinstance(profile, Profile) else load_profile(profile)
    roles = [Role(role)] * engines if isinstance(role, str | Role) else [Role(r) for r in role]
    if len(roles) != engines:
        raise ValueError(f"{len(roles)} roles given for {engines} engines")
    clock = time or ScaledTime(speed)
    tok = tokenizer or Tokenizer()
    started: list[EngineServer] = []
    try:
        for i in range(engines):
            port = base_port + i if base_port else 0
            publisher = (
                KvEventPublisher(kv_events.for_engine(i, host), kv_events)
                if kv_events is not None and kv_events.publishes
                else None
            )
            engine = Engine(
                profile=prof,
                tokenizer=tok,
                time=clock,
                model_name=model,
                engine_id=f"sim-{i}-{port or 'auto'}",
                lora=lora,
                kv_events=publisher,
            )
            server = EngineServer(engine, host, port, roles[i], api_key, publisher)
            try:
                await server.start()
            except BaseException:
                if publisher is not None:
                    await publisher.close()
                raise
            engine.engine_id = f"sim-{host}:{server.port}"
            started.append(server)
    except BaseException:
        for s in started:
            await s.close()
        raise
    return SimFleet(started)
