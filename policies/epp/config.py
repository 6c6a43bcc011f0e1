"""llm-d's EndpointPickerConfig, accepted as written under `routing:` and turned into our
native routing configuration (policies/config.py).

    apiVersion: llm-d.ai/v1alpha1        # or inference.networking.x-k8s.io/v1alpha1
    kind: EndpointPickerConfig
    plugins: [{type, name?, parameters?}]
    schedulingProfiles: [{name, plugins: [{pluginRef, weight?}]}]

As llm-d reads it: a plugin's name defaults to its type; a profile's plugins mix filters (run
in the order listed), scorers (weight 1 unless given) and at most one picker (the first
picker configured, else a max-score-picker, when none is listed); without profiles, one
`default` profile takes every filter, scorer and picker; one profile needs no handler. Types
and parameters map per policies/epp/plugins.py; a type of ours may be used under its own name
with our parameters. Anything that cannot be honoured is refused with one line that names it
and lists what is known.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from policies.config import RoutingConfigError
from policies.epp.plugins import (
    CHARS_PER_TOKEN,
    EppType,
    Params,
    PrefixIndexSettings,
    check_params,
    check_prefix_plugin,
    epp_types,
)

API_VERSIONS = ("llm-d.ai/v1alpha1", "inference.networking.x-k8s.io/v1alpha1")
KIND = "EndpointPickerConfig"
_KEYS = (
    "apiVersion",
    "kind",
    "plugins",
    "schedulingProfiles",
    "featureGates",
    "dataLayer",
    "parser",
)
_DATA_LAYER = ("metrics-data-source", "core-metrics-extractor")


def is_epp_config(config: Mapping[str, Any]) -> bool:
    return "apiVersion" in config or "kind" in config


@dataclass(frozen=True, slots=True)
class Decider:
    mode: Literal["never", "always", "selective"]
    threshold_tokens: int = 0  # selective: disaggregate above this many uncached tokens


@dataclass(frozen=True, slots=True)
class _Spec:
    name: str
    type: str
    params: Params
    epp: EppType


def _fail(message: str) -> RoutingConfigError:
    return RoutingConfigError(f"{KIND}: {message}")


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _fail(f"{where} must be a mapping")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _fail(f"{where} must be a list")
    return value


def translate(config: Mapping[str, Any], kinds: Mapping[str, str]) -> dict[str, Any]:
    """The native routing configuration of an EndpointPickerConfig. `kinds`: our plugin
    types and their kind (filter, scorer, picker, handler)."""
    try:
        return _translate(config, kinds)
    except RoutingConfigError as e:
        text = str(e)
        raise (e if text.startswith(KIND) else _fail(text)) from None


def _translate(config: Mapping[str, Any], kinds: Mapping[str, str]) -> dict[str, Any]:
    if config.get("apiVersion") not in API_VERSIONS:
        raise _fail(
            f"apiVersion {config.get('apiVersion')!r} is not one of {', '.join(API_VERSIONS)}"
        )
    if config.get("kind") != KIND:
        raise _fail(f"kind {config.get('kind')!r} is not {KIND}")
    for key in config:
        if key not in _KEYS:
            raise _fail(f"{key!r} cannot be honoured; keys honoured: {', '.join(_KEYS)}")
    if _list(config.get("featureGates"), "featureGates"):
        raise _fail("featureGates cannot be honoured; leave the list empty")
    specs = _specs(config, kinds)
    _check_refs(config, specs)
    index = PrefixIndexSettings()
    plugins: list[dict[str, Any]] = []
    for s in specs.values():
        params = s.epp.translate(s.name, s.params, index)
        if s.epp.role == "plugin":
            plugins.append({"type": s.epp.ours, "name": s.name, "params": params})
    profiles = _profiles(config, specs, kinds, plugins)
    handler = _handler(specs, profiles)
    if handler is not None:
        plugins.append(handler)
    out: dict[str, Any] = {"plugins": plugins, "profiles": profiles}
    if handler is not None:
        out["handler"] = handler["name"]
    if index.values:
        out["prefix_index"] = index.values
    return out


def _specs(config: Mapping[str, Any], kinds: Mapping[str, str]) -> dict[str, _Spec]:
    table = epp_types()
    specs: dict[str, _Spec] = {}
    for i, raw in enumerate(_list(config.get("plugins"), "plugins")):
        entry = _mapping(raw, f"plugins[{i}]")
        extra = [k for k in entry if k not in ("type", "name", "parameters")]
        if extra or not isinstance(entry.get("type"), str):
            raise _fail(f"plugins[{i}] takes type, name and parameters; got {', '.join(entry)}")
        llmd_type: str = entry["type"]
        name = str(entry.get("name") or llmd_type)
        if name in specs:
            raise _fail(f"duplicate plugin name {name!r}; names so far: {', '.join(specs)}")
        params = _mapping(entry.get("parameters"), f"plugin {name!r} parameters")
        epp = table.get(llmd_type)
        if epp is None and llmd_type in kinds:  # one of ours, by its own name and params
            epp = EppType("plugin", llmd_type, tuple(params), lambda n, p, i: dict(p))
        if epp is None:
            known = ", ".join(sorted({*table, *kinds}))
            raise _fail(
                f"plugin {name!r} has type {llmd_type!r}, which cannot be honoured; "
                f"types honoured: {known}"
            )
        check_params(name, llmd_type, params, epp.params)
        specs[name] = _Spec(name, llmd_type, params, epp)
    return specs


def _check_refs(config: Mapping[str, Any], specs: Mapping[str, _Spec]) -> None:
    """dataLayer and parser may only name what the proxy does itself."""
    layer = _mapping(config.get("dataLayer"), "dataLayer")
    for key in layer:
        if key not in ("sources", "injectDefaults"):
            raise _fail(f"dataLayer.{key} cannot be honoured; the proxy scrapes each /metrics")
    refs = []
    for source in _list(layer.get("sources"), "dataLayer.sources"):
        source = _mapping(source, "dataLayer.sources[]")
        refs.append(source.get("pluginRef"))
        refs += [_mapping(x, "extractors[]").get("pluginRef") for x in source.get("extractors", [])]
    for ref in refs:
        spec = specs.get(str(ref))
        if spec is None or spec.type not in _DATA_LAYER:
            raise _fail(
                f"dataLayer refers to {ref!r}; only {', '.join(_DATA_LAYER)} can be honoured "
                "(the proxy scrapes each engine's /metrics)"
            )
    parser = _mapping(config.get("parser"), "parser").get("pluginRef")
    if parser is not None and (parser not in specs or specs[parser].type != "openai-parser"):
        raise _fail(f"parser refers to {parser!r}; only an openai-parser can be honoured")


def _kind(spec: _Spec, kinds: Mapping[str, str]) -> str:
    return kinds[spec.epp.ours] if spec.epp.role == "plugin" else spec.epp.role


def _profiles(
    config: Mapping[str, Any],
    specs: Mapping[str, _Spec],
    kinds: Mapping[str, str],
    plugins: list[dict[str, Any]],
) -> list[dict[str, Any]]:
    pickable = [s.name for s in specs.values() if _kind(s, kinds) in ("filter", "scorer", "picker")]
    raw_profiles = _list(config.get("schedulingProfiles"), "schedulingProfiles") or [
        {"name": "default", "plugins": [{"pluginRef": n} for n in pickable]}
    ]
    pickers = [s.name for s in specs.values() if _kind(s, kinds) == "picker"]
    profiles = []
    for i, raw in enumerate(raw_profiles):
        prof = _mapping(raw, f"schedulingProfiles[{i}]")
        pname = str(prof.get("name") or "")
        if not pname:
            raise _fail(f"schedulingProfiles[{i}] needs a name")
        filters: list[str] = []
        scorers: list[dict[str, Any]] = []
        picker: str | None = None
        for ref_raw in _list(prof.get("plugins"), f"profile {pname!r} plugins"):
            ref = _mapping(ref_raw, f"profile {pname!r} plugins[]")
            target = specs.get(str(ref.get("pluginRef")))
            if target is None:
                raise _fail(
                    f"profile {pname!r} refers to {ref.get('pluginRef')!r}, which is not "
                    f"configured; plugins: {', '.join(specs) or 'none'}"
                )
            kind = _kind(target, kinds)
            if kind == "filter":
                filters.append(target.name)
            elif kind == "scorer":
                weight = ref.get("weight")
                scorers.append({"plugin": target.name, "weight": 1.0 if weight is None else weight})
            elif kind == "picker":
                if picker is not None:
                    raise _fail(f"profile {pname!r} has two pickers: {picker!r}, {target.name!r}")
                picker = target.name
            else:
                raise _fail(
                    f"profile {pname!r} refers to {target.name!r} ({target.type}), which is not "
                    "a filter, scorer or picker"
                )
        if picker is None:
            picker = pickers[0] if pickers else _default_picker(plugins, pickers)
        profiles.append({"name": pname, "filters": filters, "scorers": scorers, "picker": picker})
    return profiles


def _default_picker(plugins: list[dict[str, Any]], pickers: list[str]) -> str:
    name = "max-score-picker"
    plugins.append({"type": name, "name": name})
    pickers.append(name)
    return name


def _decider(specs: Mapping[str, _Spec], handler: str, name: str | None) -> Decider:
    if name is None:
        return Decider("never")
    spec = specs.get(name)
    if spec is None or spec.epp.role != "decider":
        configured = [s.name for s in specs.values() if s.epp.role == "decider"]
        raise _fail(
            f"handler {handler!r} names decider {name!r}, which is not a configured decider; "
            f"deciders configured: {', '.join(configured) or 'none'}"
        )
    if spec.type == "always-disagg-pd-decider":
        return Decider("always")
    tokens = int(spec.params.get("nonCachedTokens", 0))
    # llm-d disaggregates at >= nonCachedTokens uncached tokens; 0 turns it off
    return Decider("selective", tokens - 1) if tokens > 0 else Decider("never")


def _handler(specs: Mapping[str, _Spec], profiles: list[dict[str, Any]]) -> dict[str, Any] | None:
    handlers = [s for s in specs.values() if s.epp.role == "handler"]
    if len(handlers) > 1:
        raise _fail(f"several profile handlers: {', '.join(h.name for h in handlers)}")
    if not handlers:
        return None
    h = handlers[0]
    if h.type == "single-profile-handler":
        if len(profiles) != 1:
            raise _fail(f"single-profile-handler {h.name!r} needs exactly one profile")
        return {"type": "single-profile-handler", "name": h.name}
    p = h.params
    if h.type == "pd-profile-handler":
        check_prefix_plugin(h.name, p)
        if p.get("primaryPort"):
            raise _fail(f"plugin {h.name!r}: primaryPort (data-parallel ports) cannot be honoured")
        decode, prefill = p.get("decodeProfile", "decode"), p.get("prefillProfile", "prefill")
        if "threshold" in p:  # older llm-d: uncached prompt characters, 0 = always
            if "deciderPluginName" in p:
                raise _fail(f"plugin {h.name!r}: give threshold or deciderPluginName, not both")
            chars = int(p["threshold"])
            tokens = -(-chars // CHARS_PER_TOKEN)
            decider = Decider("selective", tokens - 1) if chars > 0 else Decider("always")
        else:
            ref = p.get("deciderPluginName", "prefix-based-pd-decider")
            decider = _decider(specs, h.name, ref)
    else:
        named = _mapping(p.get("profiles"), f"plugin {h.name!r} profiles")
        deciders = _mapping(p.get("deciders"), f"plugin {h.name!r} deciders")
        for what, given in (("profiles", named), ("deciders", deciders)):
            extra = [k for k in given if k not in ("decode", "prefill")]
            if extra:
                raise _fail(f"plugin {h.name!r}: {what}.{extra[0]} cannot be honoured (no encode)")
        if (named or deciders) and any(k not in ("profiles", "deciders") for k in p):
            raise _fail(f"plugin {h.name!r}: give profiles/deciders or the flat parameters")
        decode = named.get("decode") or p.get("decodeProfile") or "decode"
        prefill = named.get("prefill") or p.get("prefillProfile") or "prefill"
        ref = (
            deciders.get("prefill")
            or p.get("prefillDeciderPluginName")
            or p.get("deciderPluginName")
        )
        decider = _decider(specs, h.name, ref or None)
    return _pd(h.name, decode, prefill, decider)


def _pd(name: str, decode: str, prefill: str, decider: Decider) -> dict[str, Any]:
    if decider.mode == "never":  # no prefill decider: every request decodes where it prefills
        return {"type": "single-profile-handler", "name": name, "params": {"profile": decode}}
    params: dict[str, Any] = {
        "prefill_profile": prefill,
        "decode_profile": decode,
        "decider": decider.mode,
    }
    if decider.mode == "selective":
        params["uncached_threshold_tokens"] = decider.threshold_tokens
    return {"type": "disagg-profile-handler", "name": name, "params": params}
