"""Command-line flags named after settings (`--discovery-namespace llm` sets
`discovery_namespace`), shared by the subcommands that take them: values are validated with
the settings, so a bad one is named the same way."""

from __future__ import annotations

from pathlib import Path
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


def fleet_flags(p: Any) -> None:
    """The engines, the routing and the settings file: the flags every subcommand that routes
    over a fleet takes (`serve`, `epp`)."""
    p.add_argument(
        "--backend",
        action="append",
        dest="backends",
        metavar="URL",
        help="a vLLM server's base URL; repeat for each backend",
    )
    p.add_argument("--policy", help="routing policy name (default least_requests)")
    p.add_argument("--config", type=Path, help="YAML settings file")
    p.add_argument("--log-level", help="critical|error|warning|info|debug")


def discovery_flags(p: Any) -> None:
    """Pod discovery's switch and settings."""
    p.add_argument(
        "--discovery-kubernetes",
        action="store_const",
        const=True,
        help="add and remove backends as Kubernetes pods come and go (docs/deploy.md)",
    )
    setting_flags(p, DISCOVERY_FLAGS)
