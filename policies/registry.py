"""One place that maps a policy name to its factory."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policies.base import Policy
from policies.simple import LeastRequests, RoundRobin

PolicyFactory = Callable[[Mapping[str, Any]], Policy]


def builtin_policies() -> dict[str, PolicyFactory]:
    return {
        "round_robin": lambda _params: RoundRobin(),
        "least_requests": lambda _params: LeastRequests(),
    }


class UnknownPolicy(ValueError):
    pass


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Policy:
    factories = builtin_policies()
    try:
        factory = factories[name]
    except KeyError:
        known = ", ".join(sorted(factories))
        raise UnknownPolicy(f"unknown policy {name!r}; known policies: {known}") from None
    return factory(params or {})


def build_routing(config: Mapping[str, Any]) -> Policy:
    """The YAML form of routing; until plugin profiles exist it names one policy."""
    name = config.get("policy")
    if not isinstance(name, str):
        raise UnknownPolicy("routing: expected a 'policy' name")
    return build_policy(name, config.get("params") or {})
