"""llm-d's plugin types (and the Gateway API inference extension's), and how each becomes
one of ours: its type, and its parameters translated where they mean the same.

Roles:
- `plugin`: a filter, scorer or picker of ours;
- `handler`, `decider`: profile handlers and the P/D deciders they name (policies/epp/config.py
  turns a handler and its decider into one of our handlers);
- `native`: what the proxy does itself (scraping /metrics, parsing OpenAI requests, sending
  the prefill leg of a P/D request, its own in-flight accounting): accepted, nothing to build;
  a prefix-cache producer's parameters still go to the prefix index.
Any other parameter is refused: a configuration runs as written or not at all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from policies.config import RoutingConfigError

Params = Mapping[str, Any]
Role = Literal["plugin", "handler", "decider", "native"]
CHARS_PER_TOKEN = 4  # llm-d's estimate, and the prefix index's


class PrefixIndexSettings:
    """prefix_index values gathered from llm-d's prefix plugins; two plugins may not disagree."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._set_by: dict[str, str] = {}

    def set(self, key: str, value: Any, plugin: str) -> None:
        if key in self.values and self.values[key] != value:
            raise RoutingConfigError(
                f"plugin {plugin!r} sets the prefix index's {key} to {value!r}, but plugin "
                f"{self._set_by[key]!r} set it to {self.values[key]!r}: they share one index"
            )
        self.values[key] = value
        self._set_by[key] = plugin


# (plugin name, its llm-d parameters, the prefix index settings) -> our parameters
Translate = Callable[[str, Params, PrefixIndexSettings], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class EppType:
    role: Role
    ours: str  # our plugin type ("" where nothing of ours is built)
    params: tuple[str, ...]  # the llm-d parameters honoured
    translate: Translate


def check_params(name: str, llmd_type: str, params: Params, known: tuple[str, ...]) -> None:
    unknown = [k for k in params if k not in known]
    if unknown:
        raise RoutingConfigError(
            f"plugin {name!r} ({llmd_type}): parameter {unknown[0]!r} cannot be honoured; "
            f"parameters honoured: {', '.join(known) or 'none'}"
        )


def _nothing(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    return {}


def _one_endpoint(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    if p.get("maxNumOfEndpoints", 1) != 1:
        raise RoutingConfigError(
            f"plugin {name!r}: maxNumOfEndpoints must be 1: the proxy routes each request to "
            "one backend and retries on its own"
        )
    return {}


def _label_selector(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    return {"match_labels": dict(p.get("matchLabels") or {})}


def _affinity_filter(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    # llm-d's defaults, where they differ from ours
    return {
        "threshold": p.get("affinityThreshold", 0.8),
        "explore_probability": p.get("explorationProbability", 0.01),
    }


def _tier_filter(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    return {"explore_probability": p.get("epsilonExploreNeg", 0.01)}


def _latency_scorer(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    return {
        "ttft_weight": p.get("ttftWeight", 0.8),
        "tpot_weight": p.get("tpotWeight", 0.2),
        "headroom": p.get("headroomSelectionStrategy", "least"),
    }


def _prefix_index(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    """llm-d's prefix parameters, on our shared index (text cut at 4 characters a token)."""
    tokens = p.get("blockSizeTokens")
    chars = p.get("blockSize") or p.get("hashBlockSize")  # legacy: characters
    if tokens is not None and chars is not None:
        raise RoutingConfigError(f"plugin {name!r}: give blockSizeTokens or blockSize, not both")
    block_tokens = int(tokens) if tokens is not None else 16  # llm-d's default
    index.set("chars_per_block", int(chars or block_tokens * CHARS_PER_TOKEN), name)
    if "lruCapacityPerServer" in p:
        index.set("capacity_blocks", int(p["lruCapacityPerServer"]), name)
    if p.get("maxPrefixTokensToMatch"):
        index.set("max_blocks", int(p["maxPrefixTokensToMatch"]) // block_tokens, name)
    else:
        index.set("max_blocks", int(p.get("maxPrefixBlocksToMatch") or 256), name)
    index.set("auto_capacity", bool(p.get("autoTune", True)), name)
    return {}


_PREFIX_PARAMS = (
    "autoTune",
    "blockSizeTokens",
    "blockSize",
    "hashBlockSize",
    "maxPrefixBlocksToMatch",
    "maxPrefixTokensToMatch",
    "lruCapacityPerServer",
)


def check_prefix_plugin(name: str, p: Params) -> None:
    """`prefixPluginType` names whose prefix state a plugin reads: ours is the approximate
    index, so only llm-d's approximate prefix-cache-scorer can be honoured."""
    kind = p.get("prefixPluginType", "prefix-cache-scorer")
    if kind != "prefix-cache-scorer":
        raise RoutingConfigError(
            f"plugin {name!r}: prefixPluginType {kind!r} cannot be honoured; it reads the "
            "approximate prefix index (prefix-cache-scorer)"
        )


def _no_hit_lru(name: str, p: Params, index: PrefixIndexSettings) -> dict[str, Any]:
    check_prefix_plugin(name, p)
    return {"lru_size": p.get("lruSize") or 1024}


def _plugin(ours: str, params: tuple[str, ...] = (), translate: Translate = _nothing) -> EppType:
    return EppType("plugin", ours, params, translate)


def _native(params: tuple[str, ...] = (), translate: Translate = _nothing) -> EppType:
    return EppType("native", "", params, translate)


_PICKER = ("maxNumOfEndpoints",)
_LABELS = ("matchLabels",)


def epp_types() -> dict[str, EppType]:
    return {
        # filters
        "decode-filter": _plugin("decode-endpoints-filter"),
        "prefill-filter": _plugin("prefill-endpoints-filter"),
        "label-selector-filter": _plugin(
            "label-selector-filter", ("matchLabels",), _label_selector
        ),
        "by-label-selector": _plugin("label-selector-filter", ("matchLabels",), _label_selector),
        "prefix-cache-affinity-filter": _plugin(
            "prefix-cache-affinity-filter",
            ("affinityThreshold", "explorationProbability"),
            _affinity_filter,
        ),
        "slo-headroom-tier-filter": _plugin(
            "slo-headroom-tier-filter", ("epsilonExploreNeg",), _tier_filter
        ),
        # scorers
        "queue-scorer": _plugin("queue-depth-scorer"),
        "kv-cache-utilization-scorer": _plugin("kv-cache-utilization-scorer"),
        "running-requests-size-scorer": _plugin("running-requests-size-scorer"),
        "prefix-cache-scorer": _plugin("prefix-cache-scorer", _PREFIX_PARAMS, _prefix_index),
        "lora-affinity-scorer": _plugin("lora-affinity-scorer"),
        "latency-scorer": _plugin(
            "latency-scorer",
            ("ttftWeight", "tpotWeight", "headroomSelectionStrategy"),
            _latency_scorer,
        ),
        "no-hit-lru-scorer": _plugin(
            "no-hit-lru-scorer", ("lruSize", "prefixPluginType", "prefixPluginName"), _no_hit_lru
        ),
        # pickers
        "max-score-picker": _plugin("max-score-picker", _PICKER, _one_endpoint),
        "random-picker": _plugin("random-picker", _PICKER, _one_endpoint),
        "weighted-random-picker": _plugin("weighted-random-picker", _PICKER, _one_endpoint),
        # profile handlers and P/D deciders (policies/epp/config.py)
        "single-profile-handler": EppType("handler", "single-profile-handler", (), _nothing),
        "pd-profile-handler": EppType(
            "handler",
            "disagg-profile-handler",
            (
                "decodeProfile",
                "prefillProfile",
                "deciderPluginName",
                "prefixPluginType",
                "prefixPluginName",
                "primaryPort",
                "threshold",
                "hashBlockSize",
            ),
            _nothing,
        ),
        "disagg-profile-handler": EppType(
            "handler",
            "disagg-profile-handler",
            (
                "profiles",
                "deciders",
                "decodeProfile",
                "prefillProfile",
                "deciderPluginName",
                "prefillDeciderPluginName",
            ),
            _nothing,
        ),
        "prefix-based-pd-decider": EppType("decider", "", ("nonCachedTokens",), _nothing),
        "always-disagg-pd-decider": EppType("decider", "", (), _nothing),
        # what the proxy does itself
        "prefill-header-handler": _native(("prefillProfile",)),
        "disagg-headers-handler": _native(("prefillProfile",)),
        "approx-prefix-cache-producer": _native(_PREFIX_PARAMS, _prefix_index),
        "metrics-data-source": _native(),
        "core-metrics-extractor": _native(),
        "openai-parser": _native(),
        "inflight-load-producer": _native(),
    }
