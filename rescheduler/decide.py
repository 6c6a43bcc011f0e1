"""One rescheduling cycle's decision: `decide(view, config, now) -> Plan`.

The configured policies run in order (rescheduler/policies.py). Each proposal is validated
against the migrations already chosen this cycle, by earlier policies or earlier in the same
proposal:
- a migration A -> B is dropped when B -> A is already chosen (the two would only swap
  requests back and forth);
- a request is in at most one migration: keys already moving are removed from later
  migrations, and a migration left with no request is dropped.
The plan holds every validated migration and, per policy, what it saw and did (`PolicyOutcome`)
for the admin API and the debug log.

Pure: no I/O, no clock (the caller passes `now`), no state between calls; every choice is
ordered by instance id or request key, so the same input always gives the same plan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rescheduler.config import LOAD_METRICS, POLICIES, ReschedulerConfig
from rescheduler.policies import POLICY_TABLE, Proposal
from rescheduler.view import ClusterView, Migration


@dataclass(frozen=True, slots=True)
class PolicyOutcome:
    """One policy's part of a plan."""

    policy: str
    sources: tuple[str, ...]  # the instances it found that should give requests
    targets: tuple[str, ...]  # the instances it found that may take them
    migrations: tuple[Migration, ...]  # what it added to the plan, after validation
    note: str  # why it moves nothing (or what validation dropped); "" when all went through


@dataclass(frozen=True, slots=True)
class Plan:
    migrations: tuple[Migration, ...]
    outcomes: tuple[PolicyOutcome, ...]


def check_config(config: ReschedulerConfig) -> None:
    """ValueError for a policy or load metric the core does not know, naming the known ones."""
    unknown = [p for p in config.policies if p not in POLICY_TABLE]
    if unknown:
        raise ValueError(
            f"unknown rescheduling policies {', '.join(unknown)}; known: {', '.join(POLICIES)}"
        )
    for setting, metric in (
        ("decode_load_metric", config.decode_load_metric),
        ("neutral_load_metric", config.neutral_load_metric),
    ):
        if metric not in LOAD_METRICS:
            raise ValueError(f"unknown {setting} {metric!r}; known: {', '.join(LOAD_METRICS)}")


class _Chosen:
    """The migrations chosen so far this cycle, and the validation against them."""

    def __init__(self) -> None:
        self.migrations: list[Migration] = []
        self._pairs: set[tuple[str, str]] = set()
        self._moving: set[str] = set()

    def admit(self, proposed: Iterable[Migration]) -> list[Migration]:
        """Add what passes validation; return it."""
        admitted: list[Migration] = []
        for m in proposed:
            if m.source == m.target or (m.target, m.source) in self._pairs:
                continue
            keys = tuple(dict.fromkeys(k for k in m.requests if k not in self._moving))
            if not keys:
                continue
            kept = Migration(m.policy, m.source, m.target, keys)
            self._pairs.add((m.source, m.target))
            self._moving.update(keys)
            admitted.append(kept)
        self.migrations += admitted
        return admitted


def _note(proposal: Proposal, admitted: list[Migration]) -> str:
    proposed = len(proposal.migrations)
    if not proposed or (
        len(admitted) == proposed
        and all(
            a.requests == p.requests for a, p in zip(admitted, proposal.migrations, strict=True)
        )
    ):
        return proposal.note
    moved = sum(len(a.requests) for a in admitted)
    wanted = sum(len(p.requests) for p in proposal.migrations)
    return (
        f"validation kept {len(admitted)} of {proposed} migrations ({moved} of {wanted} "
        "requests): the rest reversed an earlier pair or named requests already moving"
    )


def decide(view: ClusterView, config: ReschedulerConfig, now: float) -> Plan:
    check_config(config)
    chosen = _Chosen()
    outcomes = []
    for name in config.policies:
        proposal = POLICY_TABLE[name].propose(view, config, now)
        admitted = chosen.admit(proposal.migrations)
        outcomes.append(
            PolicyOutcome(
                policy=name,
                sources=proposal.sources,
                targets=proposal.targets,
                migrations=tuple(admitted),
                note=_note(proposal, admitted),
            )
        )
    return Plan(migrations=tuple(chosen.migrations), outcomes=tuple(outcomes))
