"""One registry: plugin type -> (params model, factory); and the builders the proxy calls.

- `build_policy(name, params)`: a whole algorithm by name (`--policy lmetric`);
- `build_routing(config)`: the YAML `routing:` section (plugins, profiles, handler), or an
  llm-d EndpointPickerConfig in its place.
Both return a `Scheduler`. Every configuration error is a `RoutingConfigError` (a ValueError)
whose message lists what is known, so start-up fails with something actionable.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from policies.config import PrecisePrefixConfig, RoutingConfig, ScorerRef
from policies.config import RoutingConfigError as RoutingConfigError  # its home for callers
from policies.epp.config import is_epp_config, translate
from policies.filters.labels import (
    LabelSelectorFilter,
    LabelSelectorParams,
    decode_filter,
    prefill_filter,
)
from policies.filters.prefix_affinity import PrefixAffinityParams, PrefixCacheAffinityFilter
from policies.filters.slo_tier import SloHeadroomTierFilter, SloTierParams
from policies.framework import RoutingServices
from policies.handlers.disagg import DisaggParams, DisaggProfileHandler
from policies.handlers.single import SingleProfileHandler, SingleProfileParams
from policies.names import ALGORITHM_PICKERS
from policies.names import policy_names as policy_names  # its home for callers
from policies.pickers.autellix import AutellixParams, AutellixPicker
from policies.pickers.baseline import LeastRequestsPicker, PowerOfTwoPicker, RoundRobinPicker
from policies.pickers.cache_balance import CacheBalanceParams, CacheBalancePicker
from policies.pickers.least_prefill import LeastPrefillParams, LeastPrefillPicker
from policies.pickers.lmetric import LMetricPicker
from policies.pickers.params import NoParams, SeedParams
from policies.pickers.score import MaxScorePicker, RandomPicker, WeightedRandomPicker
from policies.pickers.unified import UnifiedParams, UnifiedPicker
from policies.profile import Profile, WeightedScorer
from policies.scheduler import Scheduler
from policies.scorers.latency import LatencyScorer, LatencyScorerParams
from policies.scorers.load import (
    KvCacheUtilizationScorer,
    QueueDepthScorer,
    RunningRequestsScorer,
    TokenLoadScorer,
)
from policies.scorers.lora import LoraAffinityScorer
from policies.scorers.no_hit_lru import NoHitLruParams, NoHitLruScorer
from policies.scorers.precise_prefix import PrecisePrefixCacheScorer
from policies.scorers.prefix import PrefixCacheScorer
from policies.scorers.session import SessionAffinityParams, SessionAffinityScorer

Kind = Literal["filter", "scorer", "picker", "handler"]
# (validated params, shared services, instance name) -> plugin
Factory = Callable[[Any, RoutingServices, str], object]


class UnknownPolicy(RoutingConfigError):
    pass


@dataclass(frozen=True, slots=True)
class PluginType:
    kind: Kind
    params: type[BaseModel]
    factory: Factory


def plugin_types() -> dict[str, PluginType]:
    return {
        # filters
        "prefix-cache-affinity-filter": PluginType(
            "filter",
            PrefixAffinityParams,
            lambda p, s, n: PrefixCacheAffinityFilter(p, s, n),
        ),
        "label-selector-filter": PluginType(
            "filter", LabelSelectorParams, lambda p, s, n: LabelSelectorFilter(p.match_labels, n)
        ),
        "prefill-endpoints-filter": PluginType(
            "filter", NoParams, lambda p, s, n: prefill_filter(n)
        ),
        "decode-endpoints-filter": PluginType("filter", NoParams, lambda p, s, n: decode_filter(n)),
        "slo-headroom-tier-filter": PluginType(
            "filter", SloTierParams, lambda p, s, n: SloHeadroomTierFilter(p, n)
        ),
        # scorers
        "queue-depth-scorer": PluginType("scorer", NoParams, lambda p, s, n: QueueDepthScorer(n)),
        "kv-cache-utilization-scorer": PluginType(
            "scorer", NoParams, lambda p, s, n: KvCacheUtilizationScorer(n)
        ),
        "running-requests-size-scorer": PluginType(
            "scorer", NoParams, lambda p, s, n: RunningRequestsScorer(n)
        ),
        "token-load-scorer": PluginType("scorer", NoParams, lambda p, s, n: TokenLoadScorer(n)),
        "prefix-cache-scorer": PluginType(
            "scorer", NoParams, lambda p, s, n: PrefixCacheScorer(s, n)
        ),
        "precise-prefix-cache-scorer": PluginType(
            "scorer", NoParams, lambda p, s, n: PrecisePrefixCacheScorer(s, n)
        ),
        "session-affinity-scorer": PluginType(
            "scorer", SessionAffinityParams, lambda p, s, n: SessionAffinityScorer(p, n)
        ),
        "no-hit-lru-scorer": PluginType(
            "scorer", NoHitLruParams, lambda p, s, n: NoHitLruScorer(s, n, p.lru_size)
        ),
        "lora-affinity-scorer": PluginType(
            "scorer", NoParams, lambda p, s, n: LoraAffinityScorer(n)
        ),
        "latency-scorer": PluginType(
            "scorer", LatencyScorerParams, lambda p, s, n: LatencyScorer(p, n)
        ),
        # pickers
        "max-score-picker": PluginType(
            "picker", SeedParams, lambda p, s, n: MaxScorePicker(p.seed, n)
        ),
        "random-picker": PluginType("picker", SeedParams, lambda p, s, n: RandomPicker(p.seed, n)),
        "weighted-random-picker": PluginType(
            "picker", SeedParams, lambda p, s, n: WeightedRandomPicker(p.seed, n)
        ),
        "round-robin-picker": PluginType("picker", NoParams, lambda p, s, n: RoundRobinPicker(n)),
        "least-requests-picker": PluginType(
            "picker", NoParams, lambda p, s, n: LeastRequestsPicker(n)
        ),
        "power-of-two-picker": PluginType(
            "picker", SeedParams, lambda p, s, n: PowerOfTwoPicker(p.seed, n)
        ),
        "lmetric-picker": PluginType("picker", NoParams, lambda p, s, n: LMetricPicker(s, n)),
        "unified-picker": PluginType(
            "picker", UnifiedParams, lambda p, s, n: UnifiedPicker(p, s, n)
        ),
        "cache-balance-picker": PluginType(
            "picker", CacheBalanceParams, lambda p, s, n: CacheBalancePicker(p, s, n)
        ),
        "least-prefill-picker": PluginType(
            "picker", LeastPrefillParams, lambda p, s, n: LeastPrefillPicker(p, s, n)
        ),
        "autellix-picker": PluginType(
            "picker", AutellixParams, lambda p, s, n: AutellixPicker(p, n)
        ),
        # profile handlers
        "single-profile-handler": PluginType(
            "handler", SingleProfileParams, lambda p, s, n: SingleProfileHandler(p.profile, n)
        ),
        "disagg-profile-handler": PluginType(
            "handler", DisaggParams, lambda p, s, n: DisaggProfileHandler(p, s, n)
        ),
    }


def _algorithm_config(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    if name == "prefix_aware":
        # llm-d's default shape: prefix affinity balanced against queue and KV pressure.
        return {
            "name": name,
            "plugins": [
                {"type": "prefix-cache-scorer", "name": "prefix"},
                {"type": "queue-depth-scorer", "name": "queue"},
                {"type": "kv-cache-utilization-scorer", "name": "kv"},
                {"type": "max-score-picker", "name": "max", "params": dict(params)},
            ],
            "profiles": [
                {
                    "name": "default",
                    "scorers": [
                        {"plugin": "prefix", "weight": 3.0},
                        {"plugin": "queue", "weight": 2.0},
                        {"plugin": "kv", "weight": 2.0},
                    ],
                    "picker": "max",
                }
            ],
        }
    picker = ALGORITHM_PICKERS[name]
    return {
        "name": name,
        "plugins": [{"type": picker, "name": name, "params": dict(params)}],
        "profiles": [{"name": "default", "picker": name}],
    }


def build_policy(name: str, params: Mapping[str, Any] | None = None) -> Scheduler:
    if name not in policy_names():
        known = ", ".join(policy_names())
        raise UnknownPolicy(f"unknown policy {name!r}; known policies: {known}")
    return build_routing(_algorithm_config(name, params or {}))


def _field_list(model: type[BaseModel]) -> str:
    fields = [
        f"{k}={v.default!r}" if not v.is_required() else k for k, v in model.model_fields.items()
    ]
    return ", ".join(fields) or "(no params)"


def _errors(e: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in err['loc']) or '(root)'}: {err['msg']}" for err in e.errors()
    )


def build_routing(config: Mapping[str, Any]) -> Scheduler:
    """Build the policy of a `routing:` config section, native or llm-d's
    EndpointPickerConfig (policies/epp/); raise RoutingConfigError."""
    if is_epp_config(config):
        config = translate(config, {t: spec.kind for t, spec in plugin_types().items()})
    try:
        cfg = RoutingConfig.model_validate(dict(config))
    except ValidationError as e:
        raise RoutingConfigError(
            f"bad routing config: {_errors(e)}; known keys: {', '.join(RoutingConfig.model_fields)}"
        ) from None
    if cfg.policy is not None:
        if cfg.plugins or cfg.profiles:
            raise RoutingConfigError("routing config: give either `policy` or `plugins`+`profiles`")
        if cfg.policy not in policy_names():
            known = ", ".join(policy_names())
            raise UnknownPolicy(f"unknown policy {cfg.policy!r}; known policies: {known}")
        algo = _algorithm_config(cfg.policy, cfg.params)
        algo.update(prefix_index=cfg.prefix_index.model_dump(), explain_all=cfg.explain_all)
        if cfg.precise_prefix is not None:
            algo["precise_prefix"] = cfg.precise_prefix.model_dump()
        return build_routing(algo)
    if not cfg.profiles:
        raise RoutingConfigError("routing config needs `policy`, or `plugins` and `profiles`")

    types = plugin_types()
    pi = cfg.prefix_index
    precise = cfg.precise_prefix or PrecisePrefixConfig.model_validate({})
    services = RoutingServices(
        pi.chars_per_block,
        pi.capacity_blocks,
        pi.max_blocks,
        pi.auto_capacity,
        precise.max_blocks_per_backend,
        precise.warmup_s,
    )
    if cfg.precise_prefix is not None:
        services.use_precise_index()
    plugins: dict[str, tuple[Kind, object]] = {}
    for pc in cfg.plugins:
        name = pc.name or pc.type
        if name in plugins:
            raise RoutingConfigError(
                f"duplicate plugin name {name!r}; names so far: {', '.join(plugins)}"
            )
        spec = types.get(pc.type)
        if spec is None:
            known = ", ".join(sorted(types))
            raise RoutingConfigError(f"unknown plugin type {pc.type!r}; known types: {known}")
        try:
            params = spec.params.model_validate(pc.params)
        except ValidationError as e:
            raise RoutingConfigError(
                f"bad params for plugin {name!r} ({pc.type}): {_errors(e)}; "
                f"its params: {_field_list(spec.params)}"
            ) from None
        try:
            plugins[name] = (spec.kind, spec.factory(params, services, name))
        except ValueError as e:
            raise RoutingConfigError(f"plugin {name!r} ({pc.type}): {e}") from None

    def ref(name: str, kind: Kind, where: str) -> Any:
        found = plugins.get(name)
        if found is None or found[0] != kind:
            of_kind = ", ".join(n for n, (k, _) in plugins.items() if k == kind) or "none"
            raise RoutingConfigError(
                f"{where} refers to {name!r}, which is not a {kind} plugin; "
                f"{kind} plugins configured: {of_kind}"
            )
        return found[1]

    profiles: dict[str, Profile] = {}
    for pr in cfg.profiles:
        if pr.name in profiles:
            raise RoutingConfigError(f"duplicate profile name {pr.name!r}")
        where = f"profile {pr.name!r}"
        scorers = []
        for s in pr.scorers:
            sref = ScorerRef(plugin=s, weight=1.0) if isinstance(s, str) else s
            scorers.append(WeightedScorer(ref(sref.plugin, "scorer", where), sref.weight))
        profiles[pr.name] = Profile(
            pr.name,
            [ref(f, "filter", where) for f in pr.filters],
            scorers,
            ref(pr.picker, "picker", where),
        )

    if cfg.handler is not None:
        handler = ref(cfg.handler, "handler", "routing.handler")
    else:
        handlers = [p for k, p in plugins.values() if k == "handler"]
        if len(handlers) == 1:
            handler = handlers[0]
        elif len(handlers) > 1:
            raise RoutingConfigError("several profile handlers configured: name one in `handler`")
        elif len(profiles) == 1:
            handler = SingleProfileHandler()
        else:
            raise RoutingConfigError(
                f"{len(profiles)} profiles ({', '.join(profiles)}) need a profile handler: "
                "add a single-profile-handler or disagg-profile-handler plugin"
            )
    for wanted in handler.profile_names():
        if wanted not in profiles:
            raise RoutingConfigError(
                f"handler {handler.name!r} needs profile {wanted!r}; "
                f"profiles configured: {', '.join(profiles)}"
            )
    return Scheduler(
        cfg.name or "routing",
        profiles,
        handler,
        services,
        [p for _, p in plugins.values()],
        explain_all=cfg.explain_all,
    )
