"""`LocalConnector`: workers as local processes, one per worker, registered with the proxy.

Scale-up starts a process from the role's command template (a list of arguments with `{port}`
and `{role}` placeholders; the simulated engine by default, `vllm serve ...` for real), waits
until its `/health` answers, and registers it (POST /admin/backends with its role).
Scale-down picks the cheapest worker to drain among those this connector started
(`choose_victim`), drains it (planner/drain.py), then ends its process by PID: SIGTERM, then
SIGKILL after a bound. A drain that times out leaves the worker up and raises `DrainTimeout`.

A JSON state file holds the workers it started (id, url, role, pid, port, GPUs), so a
restarted planner knows its processes; those no longer alive are forgotten. Each worker gets
`CUDA_VISIBLE_DEVICES` from a budget of GPU ids, `engine_num_gpu` of them per worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO

import httpx

from fleet.clock import Clock, SystemClock
from fleet.types import Role
from planner.config import PlannerRole
from planner.connector import WorkerInfo
from planner.drain import DrainReport, choose_victim, drain, drained_or_raise, live_tokens
from planner.drain import DrainTimeout as DrainTimeout  # where callers have caught it
from planner.events import NoEvents, PlannerEvents
from planner.proxy_admin import ProxyAdmin

log = logging.getLogger("fleet_proxy.planner")

SIM_COMMAND = (
    sys.executable,
    "-c",
    "import sys; from simulator.cli import main; sys.exit(main(sys.argv[1:]))",
    "--engines", "1", "--base-port", "{port}", "--role", "{role}",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class LocalWorker:
    id: str
    url: str
    role: PlannerRole
    backend_role: Role  # the role it is registered with at the proxy
    pid: int
    port: int
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LocalSettings:
    # Per planner role: the command template; absent roles run the simulator.
    commands: Mapping[PlannerRole, Sequence[str]] = field(default_factory=dict)
    # The role a worker is registered with: an aggregated fleet's decode workers are `both`.
    backend_roles: Mapping[PlannerRole, Role] = field(
        default_factory=lambda: {PlannerRole.PREFILL: Role.PREFILL, PlannerRole.DECODE: Role.DECODE}
    )
    gpus: Sequence[str] = ()  # GPU ids to hand out; empty: CUDA_VISIBLE_DEVICES left alone
    engine_num_gpu: Mapping[PlannerRole, int] = field(default_factory=dict)
    state_file: Path | None = None
    log_dir: Path | None = None  # each worker's output; None: discarded
    host: str = "127.0.0.1"
    start_timeout_s: float = 600.0  # a real engine loads its weights first
    drain_deadline_s: float = 120.0
    stop_grace_s: float = 30.0  # SIGTERM to SIGKILL
    poll_s: float = 0.2


class LocalConnector:
    def __init__(
        self,
        proxy: ProxyAdmin,
        settings: LocalSettings,
        clock: Clock | None = None,
        events: PlannerEvents | None = None,
    ) -> None:
        self.proxy = proxy
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        self.events: PlannerEvents = events or NoEvents()  # hears every drain
        self._workers: dict[str, LocalWorker] = {}
        self._children: dict[int, asyncio.subprocess.Process] = {}
        self.last_drains: list[DrainReport] = []
        self._load_state()

    # -- the Connector protocol

    async def workers(self, role: PlannerRole) -> list[WorkerInfo]:
        """Every non-draining proxy backend on the role's side; managed: started here."""
        side = {Role.PREFILL} if role is PlannerRole.PREFILL else {Role.DECODE, Role.BOTH}
        return [
            WorkerInfo(b.id, b.url, role, managed=b.id in self._workers)
            for b in await self.proxy.backends()
            if b.role in side and not b.draining
        ]

    async def set_replicas(self, role: PlannerRole, n: int) -> None:
        current = await self.workers(role)
        for _ in range(n - len(current)):
            await self.start_worker(role)
        for _ in range(len(current) - n):
            await self.stop_one(role)

    # -- scale-up

    async def start_worker(self, role: PlannerRole) -> LocalWorker:
        port = _free_port(self.settings.host)
        backend_role = self.settings.backend_roles.get(role, Role(role.value))
        gpus = self.gpus_for(role)
        template = self.settings.commands.get(role, SIM_COMMAND)
        args = [a.format(port=port, role=backend_role.value) for a in template]
        env = dict(os.environ)
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        worker_id = f"planner-{role.value}-{port}"
        out: int | IO[bytes] = asyncio.subprocess.DEVNULL
        log_file = None
        if self.settings.log_dir is not None:
            self.settings.log_dir.mkdir(parents=True, exist_ok=True)
            log_file = (self.settings.log_dir / f"{worker_id}.log").open("ab")
            out = log_file
        try:
            # Its own session: a signal to the planner's terminal does not reach the workers.
            proc = await asyncio.create_subprocess_exec(
                *args,
                env=env,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if log_file is not None:
                log_file.close()
        worker = LocalWorker(
            worker_id, f"http://{self.settings.host}:{port}", role, backend_role, proc.pid, port,
            gpus,
        )  # fmt: skip
        self._children[proc.pid] = proc
        self._workers[worker_id] = worker
        self._save_state()
        try:
            await self._wait_healthy(worker, proc)
            await self.proxy.add_backend(worker.id, worker.url, backend_role)
        except BaseException:
            await self._stop_process(worker)
            raise
        log.info("planner: started %s worker %s (pid %d)", role, worker.url, proc.pid)
        return worker

    async def _wait_healthy(self, worker: LocalWorker, proc: asyncio.subprocess.Process) -> None:
        deadline = self.clock.now() + self.settings.start_timeout_s
        async with httpx.AsyncClient(timeout=2.0) as client:
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"worker {worker.id} exited with {proc.returncode}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(worker.url + "/health")).status_code == 200:
                        return
                if self.clock.now() >= deadline:
                    raise TimeoutError(f"worker {worker.id} not healthy in time")
                await asyncio.sleep(self.settings.poll_s)

    def gpus_for(self, role: PlannerRole) -> tuple[str, ...]:
        """GPU ids for a new worker of `role`: the first free ones of the budget."""
        if not self.settings.gpus:
            return ()
        need = self.settings.engine_num_gpu.get(role, 1)
        used = {g for w in self._workers.values() for g in w.gpus}
        free = [g for g in self.settings.gpus if g not in used]
        if len(free) < need:
            raise RuntimeError(f"{need} GPU(s) wanted, {len(free)} free of {self.settings.gpus}")
        return tuple(free[:need])

    # -- scale-down

    async def stop_one(self, role: PlannerRole) -> DrainReport:
        managed = [w for w in await self.workers(role) if w.managed]
        if not managed:
            raise RuntimeError(f"no {role} worker started by this planner to stop")
        victim = choose_victim(managed, await live_tokens(self.proxy))
        report = await drain(
            self.proxy, victim.id, self.settings.drain_deadline_s, self.clock,
            poll_s=self.settings.poll_s,
        )  # fmt: skip
        self.last_drains = [*self.last_drains[-9:], report]
        self.events.on_drain(role, report)
        drained_or_raise(report)
        await self._stop_process(self._workers[victim.id])
        log.info("planner: drained and stopped %s worker %s", role, victim.id)
        return report

    async def _stop_process(self, worker: LocalWorker) -> None:
        await terminate(worker.pid, self._children.pop(worker.pid, None), self.settings)
        self._workers.pop(worker.id, None)
        self._save_state()

    async def stop_all(self) -> None:
        """End every process this connector started, without draining (tests, shutdown)."""
        for w in list(self._workers.values()):
            with contextlib.suppress(Exception):
                await self.proxy.remove_backend(w.id)
            await self._stop_process(w)

    # -- the state file

    def _load_state(self) -> None:
        path = self.settings.state_file
        if path is None or not path.exists():
            return
        data = json.loads(path.read_text())
        for raw in data.get("workers", []):
            w = LocalWorker(
                id=raw["id"], url=raw["url"], role=PlannerRole(raw["role"]),
                backend_role=Role(raw["backend_role"]), pid=int(raw["pid"]),
                port=int(raw["port"]), gpus=tuple(raw.get("gpus", ())),
            )  # fmt: skip
            if _alive(w.pid):
                self._workers[w.id] = w
        self._save_state()

    def _save_state(self) -> None:
        path = self.settings.state_file
        if path is None:
            return
        data = {"workers": [asdict(w) for w in self._workers.values()]}
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path)  # atomic: a crash never leaves half a file

    def managed(self) -> list[LocalWorker]:
        return list(self._workers.values())


async def terminate(
    pid: int, child: asyncio.subprocess.Process | None, settings: LocalSettings
) -> None:
    """SIGTERM, wait up to `stop_grace_s`, then SIGKILL. `child`: our own child, reaped."""

    def gone() -> bool:
        return child.returncode is not None if child is not None else not _alive(pid)

    if gone():
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if child is not None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(child.wait(), settings.stop_grace_s)
    else:  # not our child (a restarted planner's): poll, bounded
        for _ in range(max(1, int(settings.stop_grace_s / 0.05))):
            if gone():
                break
            await asyncio.sleep(0.05)
    if not gone():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        if child is not None:
            await child.wait()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port
