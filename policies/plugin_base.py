"""What every plugin carries: its type (the registry key) and its instance name (from config)."""

from __future__ import annotations

import random


class PluginBase:
    type = ""

    def __init__(self, name: str = "") -> None:
        self.name = name or self.type


class SeededPlugin(PluginBase):
    """A plugin that draws random numbers; `seed` makes it reproducible (None: from the OS)."""

    def __init__(self, seed: int | None = None, name: str = "") -> None:
        super().__init__(name)
        self._rng = random.Random(seed)
