"""The top-level packages import each other without a cycle, and fleet stays a leaf.

Read from the source (every import statement, those inside functions and TYPE_CHECKING blocks
too), so a lazy import cannot hide a cycle."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "policies", "fleet", "rescheduler", "planner", "simulator")


def imported_modules(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for module in imported_modules(ast.parse(path.read_text(), str(path))):
                top = module.split(".")[0]
                if top in PACKAGES and top != package:
                    graph[package].add(top)
    return graph


def test_the_top_level_packages_import_each_other_without_a_cycle() -> None:
    graph = package_graph()
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        raise AssertionError(f"import cycle between packages: {e.args[1]}") from None


def test_fleet_imports_none_of_the_other_packages() -> None:
    assert package_graph()["fleet"] == set()


def test_the_check_sees_imports() -> None:
    """Guards the check itself: the proxy's known dependencies are found."""
    assert {"fleet", "policies", "rescheduler", "planner"} <= package_graph()["proxy"]
