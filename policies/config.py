"""The YAML form of a routing configuration (the proxy's `routing:` section).

```yaml
routing:
  prefix_index: {chars_per_block: 64, capacity_blocks: 31250}   # optional; also max_blocks,
                                                                # auto_capacity
  precise_prefix: {max_blocks_per_backend: 262144, warmup_s: 60}  # optional: KV events
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

from fleet.precise_prefix import DEFAULT_MAX_BLOCKS_PER_BACKEND, DEFAULT_WARMUP_S
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


class PrecisePrefixConfig(BaseModel):
    """The index of what each backend really holds, from its KV-cache events
    (fleet/precise_prefix.py). Present, or asked for by a precise-prefix-cache-scorer, it also
    gives the pickers their uncached-token figure for backends it knows."""

    model_config = ConfigDict(extra="forbid")
    max_blocks_per_backend: int = Field(DEFAULT_MAX_BLOCKS_PER_BACKEND, ge=1)
    # Seconds a backend whose events were joined mid-stream, or lost, is left to the
    # approximate index: blocks it cached before are unknown until then.
    warmup_s: float = Field(DEFAULT_WARMUP_S, ge=0, allow_inf_nan=False)


class RoutingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str | None = None
    policy: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    prefix_index: PrefixIndexConfig = Field(
        default_factory=lambda: PrefixIndexConfig.model_validate({})
    )
    precise_prefix: PrecisePrefixConfig | None = None
    plugins: list[PluginConfig] = Field(default_factory=list)
    profiles: list[ProfileConfig] = Field(default_factory=list)
    handler: str | None = None
    # Fill Decision.scores for every request, not only those with `x-fleet-debug: 1`.
    explain_all: bool = False
