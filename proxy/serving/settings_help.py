"""`fleet-proxy serve --help`'s list of settings and routing policies, generated from the
Settings model and the policy registry so that it names every one of them."""

from __future__ import annotations

import enum
import json
from typing import Any, Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from policies.names import policy_names
from proxy.settings import Settings


def _default(field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)
    return str(value)


def _choices(field: FieldInfo) -> str:
    annotation = field.annotation
    if get_origin(annotation) is Literal:
        return "|".join(str(a) for a in get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "|".join(str(m.value) for m in annotation)
    return ""


def settings_epilog() -> str:
    """Every setting with its default, choices and description, then the routing policy
    names."""
    prefix = Settings.model_config.get("env_prefix", "")
    fields = Settings.model_fields
    width = max(map(len, fields))
    lines = [
        "settings, highest first: the flag above where there is one, the environment",
        f"variable {prefix}<NAME> (lists and mappings as JSON), the --config YAML file's key",
        "(README.md, Configuration, says what each does).",
        f"  {'name':<{width}}  default",
    ]
    for name, field in fields.items():
        line = f"  {name:<{width}}  {_default(field)}"
        if choices := _choices(field):
            line += f" ({choices})"
        if field.description:
            line += f"; {field.description}"
        lines.append(line)
    lines += ["", f"routing policies (--policy): {', '.join(policy_names())}"]
    return "\n".join(lines)
