"""The YAML form of a routing configuration (the proxy's `routing:` section).

```yaml
routing:
  prefix_index: {chars_per_block: 64, capacity_blocks: 31250}   # optional; also max_blocks,
                                                                # auto_capacity
  plugins:
    - {type: prefix-cache-scorer, name: prefix}
    - {type: queue-depth-scorer, name: queue}
    - {type: max-score-picker, name: best}
  profiles:
    - name: default
      scorers: [{plugin: prefix, weight: 3}, {plugin: queue, weight: 1}]
      picker: best
  handler: null          # a profile-handler plugin's name; default: the only profile
```
or a whole algorithm: `routing: {policy: unified, params: {overload_factor: 2.0}}`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fleet.prefix import DEFAULT_CAPACITY_BLOCKS, DEFAULT_CHARS_PER_BLOCK


class RoutingConfigError(ValueError):
    """A routing configuration that cannot be built; the message says what is known."""


class PluginConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: str
    name: str | None = None  # defaults to the type
    params: dict[str, Any] = Field(default_factory=dict, alias="parameters")


class ScorerRef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    plugin: str
    weight: float = Field(1.0, ge=0.0)


class ProfileConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    filters: list[str] = Field(default_factory=list)
    scorers: list[ScorerRef | str] = Field(default_factory=list)
    picker: str


class PrefixIndexConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    chars_per_block: int = Field(DEFAULT_CHARS_PER_BLOCK, ge=1)
    capacity_blocks: int = Field(DEFAULT_CAPACITY_BLOCKS, ge=1)
    # Hash and match only the prompt's first max_blocks blocks (None: every full block).
    max_blocks: int | None = Field(None, ge=1)
    # Size each backend's LRU from its vllm:cache_config_info once published.
    auto_capacity: bool = True


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    policy: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    prefix_index: PrefixIndexConfig = Field(
        default_factory=lambda: PrefixIndexConfig.model_validate({})
    )
    plugins: list[PluginConfig] = Field(default_factory=list)
    profiles: list[ProfileConfig] = Field(default_factory=list)
    handler: str | None = None
    # Fill Decision.scores for every request, not only those with `x-fleet-debug: 1`.
    explain_all: bool = False
