"""Backend health has one owner: only proxy/backends/health.py changes a backend's `healthy`
flag or its `ejected_until`; everything else reports to it.

Read from the source of every package, so a new place that decides a backend's health fails
here rather than in production, where two deciders disagree."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("proxy", "fleet", "policies", "rescheduler", "planner", "simulator")
FIELDS = frozenset({"healthy", "ejected_until"})
OWNER = "proxy/backends/health.py"
# Not judgements of a backend's health: (module, what is written).
ALLOWED = {
    # A new backend's initial health: presumed healthy, or unchecked when added at run time.
    ("fleet/registry.py", "Backend(healthy=...)"),
    # The active-health rule's verdict, which the owner applies.
    ("fleet/health.py", "CheckVerdict(healthy=...)"),
    # The outlier detector's own record of an ejection, not a backend's.
    ("fleet/outliers.py", "rec.ejected_until"),
}


def health_writes(tree: ast.AST) -> set[str]:
    """Every write to a health field: an assignment, a keyword when building or replacing an
    object, a setattr by name."""
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for part in ast.walk(target):
                if isinstance(part, ast.Attribute) and part.attr in FIELDS:
                    found.add(ast.unparse(part))
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg in FIELDS:
                    found.add(f"{ast.unparse(node.func)}({keyword.arg}=...)")
            args = node.args
            if (
                isinstance(node.func, ast.Name)
                and node.func.id == "setattr"
                and len(args) > 1
                and isinstance(args[1], ast.Constant)
                and args[1].value in FIELDS
            ):
                found.add(f"setattr(..., {args[1].value!r})")
    return found


def writes_outside_the_owner() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            module = path.relative_to(ROOT).as_posix()
            if module == OWNER:
                continue
            tree = ast.parse(path.read_text(), module)
            found |= {(module, write) for write in health_writes(tree)}
    return found


def test_only_the_owner_of_backend_health_changes_it() -> None:
    assert writes_outside_the_owner() - ALLOWED == set()


def test_the_owner_does_change_it() -> None:
    """Guards the check itself: the owner's own writes are seen."""
    tree = ast.parse((ROOT / OWNER).read_text(), OWNER)
    assert {"backend.healthy", "backend.ejected_until"} <= health_writes(tree)


def test_the_check_sees_every_way_of_writing() -> None:
    source = """
b.healthy = False
b.ejected_until += 1.0
x, fleet[0].healthy = 1, True
b.ejected_until: float = 0.0
Backend(spec=spec, healthy=False)
dataclasses.replace(b, ejected_until=5.0)
setattr(b, "healthy", True)
ok = b.healthy  # a read
"""
    assert health_writes(ast.parse(source)) == {
        "b.healthy",
        "b.ejected_until",
        "fleet[0].healthy",
        "Backend(healthy=...)",
        "dataclasses.replace(ejected_until=...)",
        "setattr(..., 'healthy')",
    }
