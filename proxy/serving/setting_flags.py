"""Command-line flags named after settings (`--discovery-namespace llm` sets
`discovery_namespace`), shared by the subcommands that take them: values are validated with
the settings, so a bad one is named the same way."""

from __future__ import annotations

from typing import Any

# Pod discovery's settings, each a flag of its own name (`--discovery-namespace llm`).
DISCOVERY_FLAGS = (
    "discovery_namespace",
    "discovery_label_selector",
    "discovery_port",
    "discovery_kubeconfig",
    "discovery_drain_timeout",
)


def setting_flags(p: Any, names: tuple[str, ...]) -> None:
    """One `--name-with-dashes V` flag per setting in `names` on the argparse parser `p`,
    its help giving the setting's default."""
    from proxy.settings import Settings

    for name in names:
        field = Settings.model_fields[name]
        default = field.get_default(call_default_factory=True)
        if isinstance(default, list):
            default = ",".join(default)
        p.add_argument(
            "--" + name.replace("_", "-"), dest=name, metavar="V", help=f"(default {default})"
        )
