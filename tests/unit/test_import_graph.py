"""The project's modules import each other without a cycle, and proxy/ keeps its layers.

Read from the source (every import statement, those inside functions and TYPE_CHECKING blocks
too), so a lazy import cannot hide a cycle or a reach across layers. `from a.b import c` is an
edge to the module `a.b.c` when there is one, else to `a.b`; relative imports are resolved
against the importing module's package."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping, Set
from graphlib import CycleError, TopologicalSorter
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = (
    "proxy",
    "policies",
    "flowcontrol",
    "fleet",
    "rescheduler",
    "planner",
    "simulator",
    "bench",
)

# proxy/'s layers from the bottom up, and which layers each may import (itself included
# where a layer's modules may import one another).
LEAVES = frozenset(
    {"proxy", "proxy.settings", "proxy.errors", "proxy.metrics", "proxy.asgi", "proxy.url_policy"}
)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "stream": frozenset({"stream"}),
    "leaves": frozenset({"stream", "leaves"}),
    "backends": frozenset({"stream", "leaves", "backends"}),
    "ports": frozenset({"stream", "leaves", "backends"}),
    "request": frozenset({"stream", "leaves", "backends", "ports", "request"}),
    "control": frozenset({"stream", "leaves", "backends", "ports", "request", "control"}),
    "gateway": frozenset({"stream", "leaves", "backends", "ports", "request", "gateway"}),
    "serving": frozenset(
        {"stream", "leaves", "backends", "ports", "request", "control", "gateway", "serving"}
    ),
}
COMPOSITION_ROOT = "proxy.serving"


def project_modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the project by dotted name (a package by its `__init__.py`)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def imported_names(module: str, path: Path, tree: ast.AST) -> Iterator[tuple[str, str | None]]:
    """(module, name) for each import in `tree`, relative ones made absolute; name is the
    imported name of a `from` import, None for a plain `import`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name


def resolve(imported: str, name: str | None, modules: Set[str]) -> str | None:
    """The project module an import loads: `a.b.c` for `from a.b import c` when that is a
    module, else the longest prefix of the imported path that is one; None outside the project."""
    if name is not None and f"{imported}.{name}" in modules:
        return f"{imported}.{name}"
    parts = imported.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Each project module and the project modules it imports."""
    modules = project_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        targets = {resolve(i, n, modules.keys()) for i, n in imported_names(module, path, tree)}
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def package_graph(graph: Mapping[str, Set[str]]) -> dict[str, set[str]]:
    packages: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for module, targets in graph.items():
        top = module.split(".")[0]
        packages[top].update(t.split(".")[0] for t in targets if not t.startswith(f"{top}."))
        packages[top].discard(top)
    return packages


def a_cycle(graph: Mapping[str, Set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None when the graph has none."""
    try:
        tuple(TopologicalSorter(graph).static_order())
    except CycleError as e:
        # graphlib lists the cycle backwards (each node is imported by the next); say it in
        # import order.
        return list(reversed(e.args[1]))
    return None


def layer_of(module: str) -> str | None:
    """The proxy/ layer a module belongs to, None outside proxy/ or in no layer."""
    if module in LEAVES:
        return "leaves"
    if module == "proxy.ports":
        return "ports"
    parts = module.split(".")
    if parts[0] == "proxy" and len(parts) > 1 and parts[1] in MAY_IMPORT:
        return parts[1]
    return None


def layer_violations(graph: Mapping[str, Set[str]]) -> list[str]:
    """Each import from a proxy/ layer into one it may not use, and each import of the
    composition root from outside proxy/serving."""
    found = []
    for module in sorted(graph):
        layer = layer_of(module)
        for target in sorted(graph[module]):
            if layer is not None and (target == "proxy" or target.startswith("proxy.")):
                target_layer = layer_of(target)
                if target_layer not in MAY_IMPORT[layer]:
                    found.append(f"{module} ({layer}) -> {target} ({target_layer})")
            elif layer != "serving" and target.split(".")[:2] == COMPOSITION_ROOT.split("."):
                found.append(f"{module} -> {target} (only proxy/serving imports it)")
    return found


def test_no_two_modules_import_each_other_in_a_cycle() -> None:
    cycle = a_cycle(module_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def test_the_top_level_packages_import_each_other_without_a_cycle() -> None:
    cycle = a_cycle(package_graph(module_graph()))
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle or ())


def test_fleet_imports_none_of_the_other_packages() -> None:
    assert package_graph(module_graph())["fleet"] == set()


def test_every_proxy_module_belongs_to_a_layer() -> None:
    """A new folder or top-level module in proxy/ must be placed in the layering, not
    escape it."""
    unplaced = [m for m in module_graph() if m.startswith("proxy") and layer_of(m) is None]
    assert unplaced == []


def test_each_proxy_layer_imports_only_the_layers_below_it() -> None:
    violations = layer_violations(module_graph())
    assert violations == [], "imports across the layering:\n" + "\n".join(violations)


def test_the_check_sees_imports() -> None:
    """Guards the check itself: known edges are found, relative and in-function ones too."""
    graph = module_graph()
    assert {"fleet", "policies", "rescheduler", "planner"} <= package_graph(graph)["proxy"]
    assert "proxy.serving.wiring" in graph["proxy.serving.app"]
    assert "proxy.request.session" in graph["proxy.request.entry"]


def test_the_import_resolution_follows_python(tmp_path: Path) -> None:
    """Guards the resolution: `from a import b` reaches submodule a.b, a relative import is
    made absolute, and an import inside a function or TYPE_CHECKING block counts."""
    pkg = tmp_path / "proxy" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "proxy" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from . import low\n")
    (pkg / "low.py").write_text("X = 1\n")
    (pkg / "mid.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from .low import X\n"
        "def f():\n    from proxy.sub import high\n"
    )
    (pkg / "high.py").write_text("from ..sub.low import X\nimport proxy.sub.mid\n")
    (tmp_path / "proxy" / "top.py").write_text("from proxy.sub import X\n")
    graph = module_graph(tmp_path)
    assert graph["proxy.sub"] == {"proxy.sub.low"}
    assert graph["proxy.sub.mid"] == {"proxy.sub.low", "proxy.sub.high"}
    assert graph["proxy.sub.high"] == {"proxy.sub.low", "proxy.sub.mid"}
    assert graph["proxy.top"] == {"proxy.sub"}


def test_the_cycle_finder_reports_a_cycle_in_import_order() -> None:
    """Guards the cycle finder: a synthetic cycle is found and named edge by edge."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    cycle = a_cycle(graph)
    assert cycle is not None
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"} and len(cycle) == 4
    assert all(after in graph[before] for before, after in pairwise(cycle))
    assert a_cycle({"a": {"b"}, "b": set()}) is None


def test_the_layer_check_reports_a_reach_upwards() -> None:
    """Guards the layer check: an upward import and an import of the composition root from
    outside serving are both reported; a downward one is not."""
    graph = {
        "proxy.stream.splice": {"proxy.settings"},
        "proxy.request.session": {"proxy.backends.upstream", "proxy.ports"},
        "policies.x": {"proxy.serving.wiring"},
    }
    assert layer_violations(graph) == [
        "policies.x -> proxy.serving.wiring (only proxy/serving imports it)",
        "proxy.stream.splice (stream) -> proxy.settings (leaves)",
    ]
