"""llm-d EndpointPickerConfig documents under `routing:`: translated to our configuration,
built, and routing; and refused, in one line, where they cannot be honoured."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from fleet.types import Role
from policies.config import RoutingConfigError
from policies.epp.config import translate
from policies.handlers.disagg import DisaggProfileHandler
from policies.handlers.single import SingleProfileHandler
from policies.registry import build_routing, plugin_types
from tests.unit.policies.builders import backend, ctx, text_blocks

KINDS = {t: spec.kind for t, spec in plugin_types().items()}

# llm-d's default scheduling shape, written as an operator would: no picker, no handler.
DEFAULT = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: queue-scorer
- type: kv-cache-utilization-scorer
- type: prefix-cache-scorer
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: queue-scorer
    weight: 2
  - pluginRef: kv-cache-utilization-scorer
    weight: 2
  - pluginRef: prefix-cache-scorer
    weight: 3
"""

PD = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    blockSizeTokens: 16
    autoTune: false
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: queue-scorer
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: prefix-based-pd-decider
  parameters:
    nonCachedTokens: 16
- type: disagg-profile-handler
  parameters:
    deciders:
      prefill: prefix-based-pd-decider
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
  - pluginRef: queue-scorer
    weight: 1
"""

# The older P/D shape: pd-profile-handler with a character threshold, a header handler.
LEGACY_PD = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefill-header-handler
- type: prefix-cache-scorer
  parameters:
    hashBlockSize: 5
    maxPrefixBlocksToMatch: 256
    lruCapacityPerServer: 31250
- type: prefill-filter
- type: decode-filter
- type: max-score-picker
- type: pd-profile-handler
  parameters:
    threshold: 10
    hashBlockSize: 5
schedulingProfiles:
- name: prefill
  plugins:
  - pluginRef: prefill-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
- name: decode
  plugins:
  - pluginRef: decode-filter
  - pluginRef: max-score-picker
  - pluginRef: prefix-cache-scorer
    weight: 2
"""

SLO_AND_LORA = """
apiVersion: llm-d.ai/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: slo-headroom-tier-filter
  name: slo-tier
- type: latency-scorer
  parameters:
    ttftWeight: 0.7
- type: lora-affinity-scorer
- type: no-hit-lru-scorer
  parameters:
    lruSize: 2048
- type: prefix-cache-scorer
- type: single-profile-handler
- type: metrics-data-source
- type: core-metrics-extractor
dataLayer:
  sources:
  - pluginRef: metrics-data-source
    extractors:
    - pluginRef: core-metrics-extractor
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: slo-tier
  - pluginRef: latency-scorer
  - pluginRef: lora-affinity-scorer
    weight: 2
  - pluginRef: no-hit-lru-scorer
"""


def load(text: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def test_the_default_shape_translates_with_llmds_defaults() -> None:
    native = translate(load(DEFAULT), KINDS)
    assert native == {
        "plugins": [
            {"type": "queue-depth-scorer", "name": "queue-scorer", "params": {}},
            {
                "type": "kv-cache-utilization-scorer",
                "name": "kv-cache-utilization-scorer",
                "params": {},
            },
            {"type": "prefix-cache-scorer", "name": "prefix-cache-scorer", "params": {}},
            {"type": "max-score-picker", "name": "max-score-picker"},  # added, as llm-d does
        ],
        "profiles": [
            {
                "name": "default",
                "filters": [],
                "scorers": [
                    {"plugin": "queue-scorer", "weight": 2},
                    {"plugin": "kv-cache-utilization-scorer", "weight": 2},
                    {"plugin": "prefix-cache-scorer", "weight": 3},
                ],
                "picker": "max-score-picker",
            }
        ],
        # llm-d's prefix defaults: 16-token blocks, 256 blocks matched, autoTune on
        "prefix_index": {"chars_per_block": 64, "max_blocks": 256, "auto_capacity": True},
    }


def test_the_default_shape_routes_a_repeated_prompt_to_its_cache() -> None:
    policy = build_routing(load(DEFAULT))
    assert isinstance(policy.handler, SingleProfileHandler)
    fleet = [backend(f"b{i}") for i in range(3)]
    prompt = text_blocks(6)
    first = policy.pick(ctx(prompt), fleet, 0).target
    for _ in range(3):
        d = policy.pick(ctx(prompt, debug=True), fleet, 0)
        assert d.target is first
        assert d.scores[first.id]["prefix-cache-scorer"] == 1.0


def test_pd_config_disaggregates_only_long_uncached_prompts() -> None:
    policy = build_routing(load(PD))
    handler = policy.handler
    assert isinstance(handler, DisaggProfileHandler)
    # nonCachedTokens 16: disaggregate at 16 or more uncached tokens, i.e. above 15
    assert (handler.params.decider, handler.params.uncached_threshold_tokens) == ("selective", 15)
    assert policy.services.auto_capacity is False and policy.services.max_blocks == 256
    fleet = [backend("p", role=Role.PREFILL), backend("d", role=Role.DECODE)]
    long = policy.pick(ctx(text_blocks(4, "l"), tokens=64), fleet, 0)
    assert (long.target.id, long.prefill and long.prefill.id) == ("d", "p")
    short = policy.pick(ctx("hello", tokens=8), fleet, 0)
    assert (short.target.id, short.prefill) == ("d", None)


def test_legacy_pd_config_with_a_character_threshold() -> None:
    policy = build_routing(load(LEGACY_PD))
    handler = policy.handler
    assert isinstance(handler, DisaggProfileHandler)
    # threshold 10 characters = 3 tokens at 4 a token: disaggregate above 2
    assert handler.params.uncached_threshold_tokens == 2
    index = policy.services.use_prefix_index()
    assert index.chars_per_block == 5  # the prefix scorer's hashBlockSize, in characters


def test_slo_latency_and_lora_plugins_take_llmds_defaults_where_unset() -> None:
    native = translate(load(SLO_AND_LORA), KINDS)
    params = {p["name"]: p.get("params") for p in native["plugins"]}
    assert params["slo-tier"] == {"explore_probability": 0.01}
    assert params["latency-scorer"] == {"ttft_weight": 0.7, "tpot_weight": 0.2, "headroom": "least"}
    assert params["no-hit-lru-scorer"] == {"lru_size": 2048}
    assert native["profiles"][0]["filters"] == ["slo-tier"]
    assert native["handler"] == "single-profile-handler"
    # the data layer is the proxy's own scraping: nothing built for it
    assert "metrics-data-source" not in params
    policy = build_routing(load(SLO_AND_LORA))
    d = policy.pick(ctx("x", debug=True), [backend("a"), backend("b")], 0)
    assert {"latency-scorer", "lora-affinity-scorer", "no-hit-lru-scorer"} <= set(d.scores["a"])


def test_no_profiles_means_one_default_profile_of_every_filter_scorer_and_picker() -> None:
    doc = {
        "apiVersion": "llm-d.ai/v1alpha1",
        "kind": "EndpointPickerConfig",
        "plugins": [{"type": "decode-filter"}, {"type": "queue-scorer"}, {"type": "random-picker"}],
    }
    assert translate(doc, KINDS)["profiles"] == [
        {
            "name": "default",
            "filters": ["decode-filter"],
            "scorers": [{"plugin": "queue-scorer", "weight": 1.0}],
            "picker": "random-picker",
        }
    ]


def test_a_prefill_decider_of_zero_tokens_never_disaggregates() -> None:
    doc = load(PD)
    doc["plugins"][5]["parameters"]["nonCachedTokens"] = 0
    policy = build_routing(doc)
    assert isinstance(policy.handler, SingleProfileHandler)
    assert policy.handler.profile == "decode"


def test_our_own_types_may_stand_in_an_epp_config_by_their_names() -> None:
    doc = load(DEFAULT)
    doc["plugins"].append({"type": "lmetric-picker", "name": "lm"})
    doc["schedulingProfiles"][0]["plugins"].append({"pluginRef": "lm"})
    native = translate(doc, KINDS)
    assert native["profiles"][0]["picker"] == "lm"


def test_the_native_format_is_unchanged() -> None:
    policy = build_routing(
        {
            "plugins": [{"type": "queue-depth-scorer", "name": "q"}, {"type": "max-score-picker"}],
            "profiles": [{"name": "p", "scorers": ["q"], "picker": "max-score-picker"}],
        }
    )
    assert policy.pick(ctx("x"), [backend("a")], 0).target.id == "a"


def edit(text: str, change: Any) -> dict[str, Any]:
    doc = load(text)
    change(doc)
    return doc


BAD = [
    (
        edit(DEFAULT, lambda d: d["plugins"].append({"type": "magic-scorer", "name": "m"})),
        r"plugin 'm' has type 'magic-scorer', which cannot be honoured; types honoured: .*"
        r"always-disagg-pd-decider, .*queue-scorer, ",
    ),
    (
        edit(DEFAULT, lambda d: d["plugins"][2].update(parameters={"blockSizeTokenz": 8})),
        r"plugin 'prefix-cache-scorer' \(prefix-cache-scorer\): parameter 'blockSizeTokenz' "
        r"cannot be honoured; parameters honoured: autoTune, blockSizeTokens, ",
    ),
    (
        edit(DEFAULT, lambda d: d["schedulingProfiles"][0]["plugins"].append({"pluginRef": "x"})),
        r"profile 'default' refers to 'x', which is not configured; plugins: queue-scorer, ",
    ),
    (
        edit(
            PD,
            lambda d: d["schedulingProfiles"][0]["plugins"].append(
                {"pluginRef": "disagg-profile-handler"}
            ),
        ),
        r"refers to 'disagg-profile-handler' \(disagg-profile-handler\), which is not a "
        r"filter, scorer or picker",
    ),
    (
        edit(
            PD,
            lambda d: (
                d["plugins"].append({"type": "random-picker"})
                or d["schedulingProfiles"][0]["plugins"].append({"pluginRef": "random-picker"})
            ),
        ),
        r"profile 'prefill' has two pickers: 'max-score-picker', 'random-picker'",
    ),
    (
        edit(DEFAULT, lambda d: d.update(apiVersion="v1")),
        r"apiVersion 'v1' is not one of llm-d.ai/v1alpha1, inference.networking.x-k8s.io/v1alpha1",
    ),
    (
        edit(DEFAULT, lambda d: d.update(saturationDetector={"pluginRef": "x"})),
        r"'saturationDetector' cannot be honoured; keys honoured: apiVersion, kind, plugins",
    ),
    (edit(DEFAULT, lambda d: d.update(featureGates=["flowControl"])), r"featureGates"),
    (
        edit(
            DEFAULT,
            lambda d: d["plugins"].append(
                {"type": "max-score-picker", "parameters": {"maxNumOfEndpoints": 2}}
            ),
        ),
        r"maxNumOfEndpoints must be 1",
    ),
    (
        edit(LEGACY_PD, lambda d: d["plugins"][5]["parameters"].update(primaryPort=8000)),
        r"plugin 'pd-profile-handler': primaryPort .* cannot be honoured",
    ),
    (
        edit(PD, lambda d: d["plugins"][6]["parameters"].update(profiles={"encode": "e"})),
        r"plugin 'disagg-profile-handler': profiles.encode cannot be honoured",
    ),
    (
        edit(PD, lambda d: d["plugins"][6]["parameters"]["deciders"].update(prefill="nope")),
        r"handler 'disagg-profile-handler' names decider 'nope', which is not a configured "
        r"decider; deciders configured: prefix-based-pd-decider",
    ),
    (
        edit(
            DEFAULT,
            lambda d: d["plugins"].append(
                {"type": "approx-prefix-cache-producer", "parameters": {"blockSizeTokens": 32}}
            ),
        ),
        r"plugin 'approx-prefix-cache-producer' sets the prefix index's chars_per_block to 128, "
        r"but plugin 'prefix-cache-scorer' set it to 64",
    ),
    (
        edit(
            SLO_AND_LORA, lambda d: d["dataLayer"]["sources"][0].update(pluginRef="latency-scorer")
        ),
        r"dataLayer refers to 'latency-scorer'; only metrics-data-source, core-metrics-extractor",
    ),
    (
        edit(
            SLO_AND_LORA,
            lambda d: d["plugins"][3]["parameters"].update(
                prefixPluginType="precise-prefix-cache-scorer"
            ),
        ),
        r"prefixPluginType 'precise-prefix-cache-scorer' cannot be honoured",
    ),
    (
        edit(DEFAULT, lambda d: d["plugins"].append({"type": "queue-scorer"})),
        r"duplicate plugin name 'queue-scorer'",
    ),
]


@pytest.mark.parametrize(("doc", "message"), BAD)
def test_what_cannot_be_honoured_is_refused_in_one_line(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(RoutingConfigError, match=message) as e:
        build_routing(doc)
    text = str(e.value)
    assert text.startswith("EndpointPickerConfig: ") and "\n" not in text


def test_our_params_are_checked_when_a_type_of_ours_is_used_by_name() -> None:
    doc = load(DEFAULT)
    doc["plugins"].append({"type": "token-load-scorer", "parameters": {"queueThresholdTokens": 9}})
    with pytest.raises(RoutingConfigError, match="bad params for plugin 'token-load-scorer'"):
        build_routing(doc)
