"""The whole routing algorithms by name, apart from the code that builds them: what lists them
(`fleet-proxy serve --help`) need not import every policy."""

from __future__ import annotations

# Whole algorithms by name: the picker that implements each (params go to it); and
# prefix_aware, a profile of several plugins (policies/registry.py builds it).
ALGORITHM_PICKERS = {
    "round_robin": "round-robin-picker",
    "least_requests": "least-requests-picker",
    "random": "random-picker",
    "power_of_two": "power-of-two-picker",
    "lmetric": "lmetric-picker",
    "unified": "unified-picker",
    "autellix": "autellix-picker",
    "cache_balance": "cache-balance-picker",
    "least_prefill": "least-prefill-picker",
}
PREFIX_AWARE = "prefix_aware"


def policy_names() -> list[str]:
    return sorted([*ALGORITHM_PICKERS, PREFIX_AWARE])
