"""What every plugin carries: its type (the registry key) and its instance name (from config)."""

from __future__ import annotations


class PluginBase:
    type = ""

    def __init__(self, name: str = "") -> None:
        self.name = name or self.type
