"""One planner, put together the same way in both run modes (inside `fleet-proxy serve` and
under `fleet-proxy plan`): the loop, its connector, and what observes them (the journal
for the status view, Prometheus metrics in the given registry, TensorBoard files when a log
directory is given)."""

from __future__ import annotations

import contextlib
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from planner.config import PlannerConfig, PlannerRole
from planner.connector import Connector
from planner.connectors import backend_roles
from planner.events import FanOut, Journal, PlannerEvents
from planner.local import LocalSettings
from planner.loop import PlannerLoop
from planner.metrics import PlannerMetrics
from planner.proxy_admin import ProxyAdmin

if TYPE_CHECKING:
    from planner.tensorboard import TensorBoardEvents


@dataclass
class Observers:
    """What watches one planner: the journal (last sample and drains, for the status view),
    Prometheus metrics, and TensorBoard files when a log directory is given."""

    journal: Journal
    metrics: PlannerMetrics
    tensorboard: TensorBoardEvents | None
    events: PlannerEvents  # metrics and TensorBoard, fanned out

    @property
    def for_connector(self) -> PlannerEvents:
        """What a connector reports its drains to: the journal too."""
        return FanOut(self.journal, self.events)

    def close(self) -> None:
        if self.tensorboard is not None:
            with contextlib.suppress(Exception):
                self.tensorboard.close()


def observers(registry: CollectorRegistry, log_dir: Path | None = None) -> Observers:
    metrics = PlannerMetrics(registry)
    tensorboard = None
    if log_dir is not None:
        # Here, not at the top: tensorboardX (with numpy and protobuf) is loaded only when
        # TensorBoard files are asked for.
        from planner.tensorboard import TensorBoardEvents

        tensorboard = TensorBoardEvents(log_dir)
    watching: list[PlannerEvents] = [metrics]
    if tensorboard is not None:
        watching.append(tensorboard)
    return Observers(Journal(), metrics, tensorboard, FanOut(*watching))


@dataclass
class Planner:
    loop: PlannerLoop
    connector: Connector
    observers: Observers

    def status(self) -> dict[str, Any]:
        return self.loop.status()

    def close(self) -> None:
        """Flush and close the TensorBoard files. Workers stay up: a restarted planner finds
        them in the state file (local) or as the pods they are (Kubernetes)."""
        self.observers.close()


def build_planner(
    proxy: ProxyAdmin, connector: Connector, config: PlannerConfig, watching: Observers
) -> Planner:
    """`connector` should report its drains to `watching.for_connector`."""
    loop = PlannerLoop(proxy, connector, config, events=watching.events, journal=watching.journal)
    return Planner(loop, connector, watching)


def local_settings(
    config: PlannerConfig,
    *,
    commands: dict[PlannerRole, str | None],
    gpus: str | None,
    state_file: Path | None,
    worker_log_dir: Path | None,
    start_timeout_s: float,
    drain_deadline_s: float,
) -> LocalSettings:
    """`LocalSettings` from the options both run modes take: command templates as shell
    lines (None: the simulator), GPU ids comma-separated."""
    return LocalSettings(
        commands={role: shlex.split(cmd) for role, cmd in commands.items() if cmd},
        backend_roles=backend_roles(config),
        gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else [],
        engine_num_gpu={role: config.engine_gpus(role) for role in PlannerRole},
        state_file=state_file,
        log_dir=worker_log_dir,
        start_timeout_s=start_timeout_s,
        drain_deadline_s=drain_deadline_s,
    )
