"""The planning loop: every `metric_pulling_interval` take a `Sample` of the proxy's backends,
decide, and when an adjustment applies, carry it out through the connector.

Thin on purpose: the decision is the mode's (`decide`, or the SLA mode's `decide_sla`, both
pure; planner/sla_mode.py picks); the fleet's load comes
from the proxy's admin API (`ProxyAdmin.backends()`: each backend's role, `metrics.waiting`,
`metrics.kv_usage`) and workers come and go through a `Connector`. While a change runs
nothing is pulled nor decided (the loop awaits it), then `change_done` starts a fresh
interval. After a change the replica counts are read back from the connector, so a change
that failed half-way (a drain that timed out) leaves the state as the fleet really is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fleet.clock import Clock, SystemClock
from planner.config import PlannerConfig, PlannerRole, check_config
from planner.connector import Connector
from planner.decide import Decision, PlannerState, advance, change_done
from planner.events import Journal, NoEvents, PlannerEvents
from planner.observe import Sample, WorkerLoad, sample
from planner.profile_file import SlaProfiles
from planner.proxy_admin import BackendStatus, ProxyAdmin
from planner.sla_mode import Decider, decider_for

log = logging.getLogger("fleet_proxy.planner")


def worker_loads(backends: Sequence[BackendStatus]) -> list[WorkerLoad]:
    """The loads `sample` reads: draining backends (on their way out) and backends not scraped
    yet are left out."""
    return [
        WorkerLoad(b.role, b.waiting or 0.0, b.kv_usage or 0.0, reading=b.reading())
        for b in backends
        if not b.draining and b.waiting is not None and b.kv_usage is not None
    ]


@dataclass(frozen=True, slots=True)
class DecisionRecord:
    """One adjustment, as the status view shows it."""

    wall_time: float  # unix seconds
    decision: Decision
    errors: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class PlannerLoop:
    def __init__(
        self,
        proxy: ProxyAdmin,
        connector: Connector,
        config: PlannerConfig,
        *,
        clock: Clock | None = None,
        keep: int = 20,
        profiles: SlaProfiles | None = None,
        events: PlannerEvents | None = None,
        journal: Journal | None = None,
    ) -> None:
        """`events` hears every sample and due decision (metrics, TensorBoard); `journal`,
        which the connector reports its drains to as well, adds the last sample and drains
        to `status()`."""
        check_config(config)
        # The mode's rules; SLA mode reads `profiles`, or the config's profile file.
        self.decider: Decider = decider_for(config, profiles)
        self.proxy = proxy
        self.connector = connector
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.history: list[Sample] = []
        self.state: PlannerState | None = None
        self._decisions: deque[DecisionRecord] = deque(maxlen=keep)
        self.events: PlannerEvents = events or NoEvents()
        self.journal = journal or Journal()

    def decisions(self) -> list[DecisionRecord]:
        """The last due adjustments, oldest first."""
        return list(self._decisions)

    def status(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "state": dataclasses.asdict(self.state) if self.state else None,
            "decisions": [d.as_json() for d in self._decisions],
            **self.journal.status(),
        }

    async def start(self) -> PlannerState:
        """The state at start: the replicas the connector sees; the first interval from now."""
        counts = await self._replicas()
        self.state = PlannerState(
            prefill_replicas=counts.get(PlannerRole.PREFILL, 0),
            decode_replicas=counts.get(PlannerRole.DECODE, 0),
            last_adjustment_at=self.clock.now(),
        )
        return self.state

    async def run(self) -> None:
        """Tick every `metric_pulling_interval` until cancelled. A tick that fails (the
        connector's API unreachable, say) is logged and the next one tries again: a transient
        fault must not end the planner."""
        while True:
            started = self.clock.now()
            try:
                await self.tick()
            except Exception:
                log.exception("planner: a tick failed; trying again next pull")
            elapsed = self.clock.now() - started
            await asyncio.sleep(max(0.0, self.config.metric_pulling_interval - elapsed))

    async def tick(self) -> Decision:
        """One pull and one decision (carried out when it applies)."""
        state = self.state if self.state is not None else await self.start()
        now = self.clock.now()
        try:
            self.history.append(sample(now, worker_loads(await self.proxy.backends())))
        except Exception as e:  # the proxy unreachable for a pull: decide on what we have
            log.warning("planner: metric pull failed: %s: %s", type(e).__name__, e)
        else:
            self.journal.on_sample(self.history[-1])
            self.events.on_sample(self.history[-1])
        decision = await self.decider.decide(self.history, state, self.config, now)
        state = advance(state, decision, self.config)
        errors: list[str] = []
        if decision.apply:
            self.state = state  # in progress while the connector works
            errors = await self._apply(decision)
            state = self.state
            try:
                counts = await self._replicas()
            except Exception as e:  # the change is still over: keep the counts it aimed for
                counts = {}
                errors.append(f"reading the replicas back: {type(e).__name__}: {e}")
                log.warning("planner: %s", errors[-1])
            state = dataclasses.replace(
                state,
                prefill_replicas=counts.get(PlannerRole.PREFILL, state.prefill_replicas),
                decode_replicas=counts.get(PlannerRole.DECODE, state.decode_replicas),
            )
            state = change_done(state, self.clock.now())
        self.state = state
        if decision.due:
            # Samples before the new interval are never read again.
            self.history = [s for s in self.history if s.at > state.last_adjustment_at]
            self._record(decision, errors)
            self.events.on_decision(decision, state, tuple(errors))
        return decision

    async def _apply(self, decision: Decision) -> list[str]:
        errors: list[str] = []
        for change in decision.changes():
            try:
                await self.connector.set_replicas(change.role, change.desired)
            except Exception as e:  # reported; the counts read back say what happened
                errors.append(f"{change.role} {change.current}->{change.desired}: {e}")
                log.warning("planner: %s", errors[-1])
        return errors

    async def _replicas(self) -> dict[PlannerRole, int]:
        return {role: len(await self.connector.workers(role)) for role in self.config.roles}

    def _record(self, decision: Decision, errors: list[str]) -> None:
        self._decisions.append(DecisionRecord(time.time(), decision, tuple(errors)))
        text = ", ".join(
            f"{r.role} {r.current}->{r.desired} {r.reason}"
            + (f" (load {r.load:.3f})" if r.load is not None else "")
            for r in decision.roles
        )
        held = f" [{decision.held_by}]" if decision.held_by else ""
        level = logging.INFO if decision.changes() else logging.DEBUG
        log.log(level, "planner: %s%s", text, held)
