"""Building policies from a name and from the YAML `routing:` section, and the errors."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from policies.registry import (
    RoutingConfigError,
    UnknownPolicy,
    build_policy,
    build_routing,
    policy_names,
)
from tests.unit.policies.builders import backend, ctx, fleet, text_blocks

WHOLE_ALGORITHMS = [
    "round_robin",
    "least_requests",
    "random",
    "power_of_two",
    "lmetric",
    "unified",
    "autellix",
    "cache_balance",
    "least_prefill",
    "prefix_aware",
]


def test_every_algorithm_builds_by_name() -> None:
    assert policy_names() == sorted(WHOLE_ALGORITHMS)
    for name in WHOLE_ALGORITHMS:
        assert build_policy(name).name == name


def picks(name: str, n: int = 6, params: dict[str, Any] | None = None) -> list[str]:
    """What `name` chooses for n different prompts without a session, in a fleet where b1 is
    idle, b2 busy and b0 the busiest (in flight and pending prefill tokens)."""
    policy = build_policy(name, params)
    bs = [
        backend("b0", in_flight=5, pending=500),
        backend("b1"),
        backend("b2", in_flight=2, pending=200),
    ]
    return [policy.pick(ctx(text_blocks(3, str(i))), bs, 0.0).target.id for i in range(n)]


@pytest.mark.parametrize(
    "name", ["least_requests", "lmetric", "unified", "autellix", "prefix_aware"]
)
def test_load_aware_algorithms_pick_the_idle_backend(name: str) -> None:
    assert picks(name) == ["b1"] * 6


def test_round_robin_takes_turns_whatever_the_load() -> None:
    assert picks("round_robin") == ["b0", "b1", "b2"] * 2


def test_random_is_reproducible_by_seed_and_reaches_every_backend() -> None:
    chosen = picks("random", 60, {"seed": 3})
    assert chosen == picks("random", 60, {"seed": 3})
    assert set(chosen) == {"b0", "b1", "b2"}


def test_power_of_two_never_picks_the_busiest_of_three() -> None:
    # Of any two of the three, the less loaded wins: b0 never does, b1 and b2 both do.
    assert set(picks("power_of_two", 60, {"seed": 3})) == {"b1", "b2"}


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicy) as e:
        build_policy("fastest")
    assert isinstance(e.value, ValueError)
    assert "lmetric" in str(e.value) and "autellix" in str(e.value)


def test_algorithm_params_are_validated() -> None:
    with pytest.raises(RoutingConfigError, match="overload_factor"):
        build_policy("unified", {"overload_factr": 3})
    with pytest.raises(RoutingConfigError, match="threshold_tokens"):
        build_policy("autellix", {"threshold_tokens": -1})


YAML = """
routing:
  prefix_index: {chars_per_block: 32, capacity_blocks: 1000}
  plugins:
    - {type: prefix-cache-affinity-filter, name: sticky, params: {threshold: 0.6}}
    - {type: prefix-cache-scorer, name: prefix}
    - {type: queue-depth-scorer, name: queue}
    - {type: kv-cache-utilization-scorer}
    - {type: max-score-picker, name: best, parameters: {seed: 4}}
  profiles:
    - name: default
      filters: [sticky]
      scorers:
        - {plugin: prefix, weight: 3}
        - {plugin: queue, weight: 1}
        - kv-cache-utilization-scorer
      picker: best
"""


def test_yaml_routing_section_builds_and_follows_prefixes() -> None:
    policy = build_routing(yaml.safe_load(YAML)["routing"])
    assert policy.services.use_prefix_index().chars_per_block == 32
    bs = fleet(4)
    home = policy.pick(ctx(text_blocks(6)), bs, 0.0).target
    for _ in range(3):
        d = policy.pick(ctx(text_blocks(8), debug=True), bs, 0.0)
        assert d.target is home
    assert set(d.scores[home.id]) >= {"prefix", "queue", "kv-cache-utilization-scorer"}


def test_policy_shortcut_in_routing_section() -> None:
    policy = build_routing({"policy": "unified", "params": {"overload_factor": 3.0}})
    assert policy.name == "unified"
    assert policy.pick(ctx("x"), fleet(2), 0.0).target.id in {"b0", "b1"}


def plugins_cfg(*plugins: dict[str, Any], picker: str = "rr", **profile: Any) -> dict[str, Any]:
    return {
        "plugins": [*plugins, {"type": "round-robin-picker", "name": "rr"}],
        "profiles": [{"name": "p", "picker": picker, **profile}],
    }


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            plugins_cfg({"type": "magic-scorer"}),
            "unknown plugin type 'magic-scorer'; known types: ",
        ),
        (plugins_cfg({"type": "queue-depth-scorer", "name": "rr"}), "duplicate plugin name 'rr'"),
        (
            plugins_cfg({"type": "label-selector-filter", "name": "f", "params": {}}),
            "bad params for plugin 'f' (label-selector-filter): match_labels: Field required",
        ),
        (
            plugins_cfg({"type": "unified-picker", "name": "u", "params": {"overload_factor": -1}}),
            "its params: cache_ratio_threshold=0.5, overload_factor=2.0",
        ),
        (
            plugins_cfg(picker="nope"),
            "refers to 'nope', which is not a picker plugin; picker plugins configured: rr",
        ),
        (
            plugins_cfg({"type": "queue-depth-scorer", "name": "q"}, filters=["q"]),
            "not a filter plugin",
        ),
        (
            {
                "plugins": [{"type": "round-robin-picker", "name": "rr"}],
                "profiles": [{"name": "a", "picker": "rr"}, {"name": "b", "picker": "rr"}],
            },
            "2 profiles (a, b) need a profile handler",
        ),
        (
            {
                "plugins": [
                    {"type": "round-robin-picker", "name": "rr"},
                    {"type": "single-profile-handler", "name": "h", "params": {"profile": "x"}},
                ],
                "profiles": [{"name": "a", "picker": "rr"}],
            },
            "handler 'h' needs profile 'x'; profiles configured: a",
        ),
        ({"policy": "nope"}, "unknown policy 'nope'; known policies: autellix"),
        ({"policy": "lmetric", "plugins": [{"type": "round-robin-picker"}]}, "either `policy`"),
        ({"plugins": []}, "needs `policy`"),
        ({"polcy": "lmetric"}, "polcy: Extra inputs are not permitted; known keys: name, policy"),
    ],
)
def test_config_errors_say_what_is_known(config: dict[str, Any], message: str) -> None:
    with pytest.raises(RoutingConfigError) as e:
        build_routing(config)
    assert message in str(e.value)


def test_explicit_single_profile_handler_selects_the_profile() -> None:
    policy = build_routing(
        {
            "plugins": [
                {"type": "round-robin-picker", "name": "rr"},
                {"type": "least-requests-picker", "name": "lr"},
                {"type": "single-profile-handler", "name": "h", "params": {"profile": "b"}},
            ],
            "profiles": [{"name": "a", "picker": "rr"}, {"name": "b", "picker": "lr"}],
        }
    )
    bs = fleet(2)
    bs[0].load.in_flight = 5
    assert {policy.pick(ctx(), bs, 0.0).target.id for _ in range(4)} == {"b1"}
