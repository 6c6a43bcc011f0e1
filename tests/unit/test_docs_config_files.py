"""Every config file a `fleet-proxy ...` command in the README or docs/*.md names ships with the
repository and loads: a settings file (`serve`/`reschedule --config`) through the proxy's
settings, a planner file (`plan --config`, `--planner-config`) through the planner's loader."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.config_file import load_config
from proxy.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

COMMAND = re.compile(r"fleet-proxy\s+(serve|plan|reschedule)\b(.*)")
# A file, not a placeholder such as FILE: a value with a config file's suffix.
CONFIG_FLAG = re.compile(r"--(planner-config|config)[ =]([^\s\]`'\"|]+\.(?:ya?ml|json))")


def logical_lines(text: str) -> list[str]:
    """The lines of `text`, a shell line continued with a backslash joined to the next."""
    return text.replace("\\\n", " ").splitlines()


def config_files(docs: list[Path]) -> list[tuple[str, str, str]]:
    """(where, loader, path) for each config file a command names: loader `planner` or
    `settings`."""
    found = []
    for doc in docs:
        for line in logical_lines(doc.read_text()):
            for command in COMMAND.finditer(line):
                subcommand, rest = command.groups()
                for flag in CONFIG_FLAG.finditer(rest):
                    name, path = flag.groups()
                    planner = name == "planner-config" or subcommand == "plan"
                    where = f"{doc.name}: {line.strip()}"
                    found.append((where, "planner" if planner else "settings", path))
    return found


def test_the_scan_finds_the_commands_the_docs_show() -> None:
    loaders = {(loader, path) for _, loader, path in config_files(DOCS)}
    assert ("planner", "examples/plan.yaml") in loaders
    assert ("settings", "examples/fleet.yaml") in loaders


def test_the_scan_tells_a_planner_file_from_a_settings_file(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(
        "    fleet-proxy serve --backend http://a:1 \\\n"
        "        [--planner-config p.yaml] --config s.yml\n"
        "`fleet-proxy plan --proxy http://a:1 --config=q.yaml` and `--config FILE`\n"
        "fleet-proxy reschedule --proxy http://a:1 --config r.yaml\n"
    )
    assert [(loader, path) for _, loader, path in config_files([doc])] == [
        ("planner", "p.yaml"),
        ("settings", "s.yml"),
        ("planner", "q.yaml"),
        ("settings", "r.yaml"),
    ]


@pytest.mark.parametrize(("where", "loader", "path"), config_files(DOCS))
def test_a_config_file_the_docs_name_ships_and_loads(where: str, loader: str, path: str) -> None:
    file = ROOT / path
    assert file.is_file(), f"{where}: {path} is not in the repository"
    if loader == "planner":
        load_config(file)
    else:
        load_settings({}, file)
