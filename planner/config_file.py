"""`PlannerConfig` from a YAML file of its field names and from string overrides (flags), the
overrides winning; checked with `check_config`. Read the same way by `fleet-proxy plan
--config` and by `fleet-proxy serve --planner-config`."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from planner.config import PlannerConfig, Topology, check_config


def config_fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(PlannerConfig))


def convert(name: str, raw: Any) -> Any:
    """A flag's or YAML value as the field's type."""
    hint = typing.get_type_hints(PlannerConfig)[name]
    if isinstance(hint, types.UnionType):  # `int | None`
        if raw is None or str(raw).lower() in ("none", ""):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is bool:
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: not a boolean: {raw!r}")
    if hint is Topology:
        return Topology(str(raw))
    return hint(raw)


def load_config(path: Path | None, overrides: Mapping[str, Any] | None = None) -> PlannerConfig:
    """ValueError (or yaml.YAMLError, OSError) naming what is wrong. `overrides`: field name
    -> raw value; None values are ignored (a flag not given)."""
    values: dict[str, Any] = {}
    names = {f.name for f in config_fields()}
    if path is not None:
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: a mapping of planner settings expected")
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"{path}: unknown planner settings {unknown}")
        values.update({k: convert(k, v) for k, v in data.items()})
    for name, raw in (overrides or {}).items():
        if raw is not None:
            values[name] = convert(name, raw)
    config = PlannerConfig(**values)
    check_config(config)
    return config
