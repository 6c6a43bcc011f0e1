"""LoRA adapters across the fleet: `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter`
fanned out to the engines (proxy/control/lora_fanout.py decides which), and the adapters
loaded this way remembered, so that an engine that joins later, or comes back after a
restart (which forgets adapters loaded at run time), gets them loaded too.

An engine that took a load lists the adapter at once (routing to it needs no wait for its
next /v1/models poll); the LoRA-affinity scorer sees its running adapters at the next
metrics scrape, as always.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import httpx

from fleet.clock import Clock
from fleet.registry import FleetRegistry
from fleet.types import Backend
from proxy.control.lora_fanout import (
    Adapter,
    Engine,
    Outcome,
    base_model,
    missing,
    plan_load,
    plan_unload,
    remembered_after_load,
    verdict,
)

log = logging.getLogger("fleet_proxy.lora")

_MESSAGE_CHARS = 300  # what an outcome quotes of an engine's answer


def engine_of(b: Backend) -> Engine:
    return Engine(b.id, b.spec.models, b.adapters)


class FleetAdapters:
    """`client` gives the control plane's HTTP client (it exists once the proxy started)."""

    def __init__(
        self,
        fleet: FleetRegistry,
        client: Callable[[], httpx.AsyncClient | None],
        clock: Clock,
        timeout: float,
    ) -> None:
        self._fleet = fleet
        self._client = client
        self._clock = clock
        self._timeout = timeout
        self.remembered: dict[str, Adapter] = {}
        self._asked_at: dict[tuple[str, str], float] = {}  # (backend id, adapter) -> clock time
        self._tasks: set[asyncio.Task[None]] = set()
        fleet.on_removed(self._forget_backend)

    def _engines(self) -> list[Engine]:
        return [engine_of(b) for b in self._fleet]

    async def load(
        self,
        name: str,
        path: str,
        base: str | None,
        chosen: list[str] | None,
        extra: dict[str, Any],
    ) -> tuple[int, dict[str, Any]]:
        engines = self._engines()
        base = base_model(base, engines)
        plan = plan_load(name, base, engines, chosen)
        body = {**extra, "lora_name": name, "lora_path": path}
        outcomes = [Outcome(i, True, None, "already loaded") for i in plan.already]
        outcomes += await asyncio.gather(*(self._call(i, "load", body) for i in plan.call))
        if any(o.ok for o in outcomes):
            before = self.remembered.get(name)
            self.remembered[name] = remembered_after_load(before, name, path, base, chosen)
        return self._answer("load", name, base, outcomes)

    async def unload(
        self, name: str, chosen: list[str] | None, extra: dict[str, Any]
    ) -> tuple[int, dict[str, Any]]:
        targets = plan_unload(name, self._engines(), chosen)
        # Forgotten first: no engine is to get it again while the unload runs.
        remembered = self.remembered.pop(name, None)
        if remembered is not None and chosen is not None:
            self.remembered[name] = remembered.unloaded_from(chosen)
        body = {**extra, "lora_name": name}
        outcomes = await asyncio.gather(*(self._call(i, "unload", body) for i in targets))
        base = remembered.base if remembered is not None else None
        return self._answer("unload", name, base, outcomes)

    def _answer(
        self, action: str, name: str, base: str | None, outcomes: list[Outcome]
    ) -> tuple[int, dict[str, Any]]:
        status = verdict(outcomes)
        return status, {
            "object": f"lora_adapter.{action}",
            "lora_name": name,
            "base_model": base,
            "status": {200: "succeeded", 207: "partial", 502: "failed"}[status],
            "backends": [o.view() for o in outcomes],
        }

    async def _call(self, backend_id: str, action: str, body: dict[str, Any]) -> Outcome:
        """Ask one engine; its outcome. A success updates what the engine is known to serve."""
        backend = self._fleet.get(backend_id)
        client = self._client()
        if backend is None or client is None:
            return Outcome(backend_id, False, None, "the backend left the fleet")
        name = str(body["lora_name"])
        try:
            r = await client.post(
                f"{backend.url}/v1/{action}_lora_adapter", json=body, timeout=self._timeout
            )
        except httpx.HTTPError as e:
            return Outcome(backend_id, False, None, f"{type(e).__name__}: {e}"[:_MESSAGE_CHARS])
        message = _message(r)
        if r.status_code != 200:
            return Outcome(backend_id, False, r.status_code, message)
        if self._fleet.get(backend_id) is backend:
            self._now_serves(backend, name, loaded=action == "load")
        return Outcome(backend_id, True, 200, message)

    def _now_serves(self, backend: Backend, name: str, *, loaded: bool) -> None:
        models = tuple(m for m in backend.spec.models if m != name)
        adapters = backend.adapters - {name}
        if loaded:
            models, adapters = (*models, name), adapters | {name}
        self._fleet.set_models(backend, models, adapters)

    # --- engines that join or come back (fleet.registry.ModelsLearned)

    def models_learned(self, backend: Backend) -> None:
        if not self.remembered:
            return
        now = self._clock.now()
        for adapter in missing(engine_of(backend), self.remembered.values(), self._asked_at, now):
            self._asked_at[(backend.id, adapter.name)] = now
            task = asyncio.get_running_loop().create_task(
                self._restore(backend.id, adapter), name=f"lora:{backend.id}:{adapter.name}"
            )
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    async def _restore(self, backend_id: str, adapter: Adapter) -> None:
        body = {"lora_name": adapter.name, "lora_path": adapter.path}
        outcome = await self._call(backend_id, "load", body)
        if outcome.ok:
            log.info("loaded LoRA adapter %s on %s, which lacked it", adapter.name, backend_id)
        else:
            log.warning(
                "could not load LoRA adapter %s on %s (asked again in a while): %s",
                adapter.name, backend_id, outcome.message,
            )  # fmt: skip

    def _forget_backend(self, backend_id: str) -> None:
        for key in [k for k in self._asked_at if k[0] == backend_id]:
            del self._asked_at[key]

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _message(r: httpx.Response) -> str:
    """An engine's answer as one line: vLLM's success is plain text, its errors JSON."""
    try:
        data = r.json()
    except ValueError:
        return r.text[:_MESSAGE_CHARS]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])[:_MESSAGE_CHARS]
    return r.text[:_MESSAGE_CHARS]
