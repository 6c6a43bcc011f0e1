from __future__ import annotations

from typing import Any

import pytest

from fleet.types import Role
from policies.filters.labels import LabelSelectorFilter, decode_filter, prefill_filter
from policies.filters.prefix_affinity import PrefixAffinityParams, PrefixCacheAffinityFilter
from policies.framework import RoutingServices, SchedulingRequest
from tests.unit.policies.builders import backend, ctx, text_blocks


def req(text: str = "", services: RoutingServices | None = None) -> SchedulingRequest:
    return SchedulingRequest(ctx(text), 0.0, services or RoutingServices(64, 1000))


ROLES = [backend("p", role=Role.PREFILL), backend("d", role=Role.DECODE), backend("both")]


@pytest.mark.parametrize(
    ("plugin", "kept"),
    [
        (prefill_filter(), ["p"]),
        (decode_filter(), ["d", "both"]),
        (LabelSelectorFilter({"role": "decode"}), ["d"]),
        (LabelSelectorFilter({}), ["p", "d", "both"]),
    ],
)
def test_role_filters(plugin: Any, kept: list[str]) -> None:
    assert [b.id for b in plugin.filter(req(), ROLES)] == kept


def test_label_selector_needs_every_label() -> None:
    f = LabelSelectorFilter({"zone": "a", "tier": "gold"})
    bs = [
        backend("1", labels={"zone": "a", "tier": "gold", "x": "y"}),
        backend("2", labels={"zone": "a"}),
        backend("3", labels={"zone": "b", "tier": "gold"}),
    ]
    assert [b.id for b in f.filter(req(), bs)] == ["1"]


def affinity(services: RoutingServices, **params: Any) -> PrefixCacheAffinityFilter:
    return PrefixCacheAffinityFilter(PrefixAffinityParams.model_validate(params), services)


@pytest.mark.parametrize(
    ("sticky_pending", "other_pending", "explore", "expected"),
    [
        (0, 0, 0.0, ["a"]),  # sticky wins
        (5000, 0, 0.0, ["a", "b", "c"]),  # TTFT load gate: the sticky backend is far behind
        (1200, 200, 0.0, ["a"]),  # behind, but within ratio x other + slack
        (0, 0, 1.0, ["a", "b", "c"]),  # exploration always
    ],
)
def test_prefix_affinity_filter_and_its_load_gate(
    sticky_pending: int, other_pending: int, explore: float, expected: list[str]
) -> None:
    services = RoutingServices(64, 1000)
    f = affinity(services, threshold=0.5, explore_probability=explore, seed=0)
    index = services.use_prefix_index()
    text = text_blocks(8)  # 512 chars = 128 tokens
    index.record("a", index.hashes(text, "m"))
    bs = [
        backend("a", pending=sticky_pending),
        backend("b", pending=other_pending),
        backend("c", pending=other_pending),
    ]
    assert [b.id for b in f.filter(req(text, services), bs)] == expected


def test_prefix_affinity_keeps_all_when_nobody_or_everybody_is_sticky() -> None:
    services = RoutingServices(64, 1000)
    f = affinity(services)
    bs = [backend("a"), backend("b")]
    assert [b.id for b in f.filter(req(text_blocks(4), services), bs)] == ["a", "b"]
