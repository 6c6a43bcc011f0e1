"""Who is asking, and how urgently: a request's tenant (its fairness id) and priority, read
from its headers and the tenant its API key names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from flowcontrol.config import FlowControlConfig

DEFAULT_TENANT = "default"
# A fairness id becomes a metric label and an admin key: bounded, printable.
MAX_TENANT_CHARS = 128


@dataclass(frozen=True, slots=True)
class Identity:
    tenant: str
    priority: int

    @property
    def sheddable(self) -> bool:
        return self.priority < 0


class Identify:
    """Reads identity from lower-case header names; `key_tenant` is the tenant the client's API
    key names (None: the key names none, or keys are off)."""

    __slots__ = ("_fairness", "_objective", "_objectives", "_priority", "_tenant_priorities")

    def __init__(self, config: FlowControlConfig) -> None:
        self._fairness = config.fairness_header
        self._objective = config.objective_header
        self._priority = config.priority_header
        self._objectives = dict(config.objectives)
        self._tenant_priorities = dict(config.tenant_priorities)

    def __call__(self, headers: Mapping[str, str], key_tenant: str | None) -> Identity:
        tenant = key_tenant or _tenant(headers.get(self._fairness)) or DEFAULT_TENANT
        return Identity(tenant, self._priority_of(headers, tenant))

    def _priority_of(self, headers: Mapping[str, str], tenant: str) -> int:
        objective = headers.get(self._objective)
        if objective is not None:
            named = self._objectives.get(objective.strip())
            if named is not None:
                return named
            number = _integer(objective)
            if number is not None:
                return number
        number = _integer(headers.get(self._priority))
        if number is not None:
            return number
        return self._tenant_priorities.get(tenant, 0)


def _tenant(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > MAX_TENANT_CHARS or not value.isprintable():
        return None
    return value


def _integer(value: str | None) -> int | None:
    if value is None:
        return None
    text = value.strip()
    digits = text[1:] if text[:1] in "+-" else text
    if not digits.isdigit() or len(digits) > 9:  # bounded: a priority, not a bignum
        return None
    return int(text)
