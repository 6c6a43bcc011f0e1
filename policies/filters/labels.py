"""Label filters: keep backends whose labels match; `role` matches the backend's role."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import BaseModel, ConfigDict

from fleet.types import Backend, Role
from policies.framework import PluginBase, SchedulingRequest


class LabelSelectorParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    match_labels: dict[str, str]


def label_value(b: Backend, key: str) -> str | None:
    if key == "role":
        return b.role.value
    return b.spec.labels.get(key)


class LabelSelectorFilter(PluginBase):
    type = "label-selector-filter"

    def __init__(self, match_labels: Mapping[str, str], name: str = "") -> None:
        super().__init__(name)
        self.match_labels = dict(match_labels)

    def filter(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> Sequence[Backend]:
        want = self.match_labels.items()
        return [b for b in candidates if all(label_value(b, k) == v for k, v in want)]


class RoleFilter(PluginBase):
    """Keeps backends of the given roles (llm-d: prefill -> prefill only; decode -> decode and
    backends that do both)."""

    def __init__(self, roles: frozenset[Role], plugin_type: str, name: str = "") -> None:
        self.type = plugin_type
        super().__init__(name)
        self.roles = roles

    def filter(self, req: SchedulingRequest, candidates: Sequence[Backend]) -> Sequence[Backend]:
        return [b for b in candidates if b.role in self.roles]


def prefill_filter(name: str = "") -> RoleFilter:
    return RoleFilter(frozenset({Role.PREFILL}), "prefill-endpoints-filter", name)


def decode_filter(name: str = "") -> RoleFilter:
    return RoleFilter(frozenset({Role.DECODE, Role.BOTH}), "decode-endpoints-filter", name)
