"""fleet-proxy's own version, from the installed package's metadata."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version


def installed_version() -> str:
    try:
        return version("fleet-proxy")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "(not installed)"
