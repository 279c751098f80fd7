"""The package's layout holds: no import cycle between its modules, and no import that runs up the
layer order docs/architecture.md documents (its "Layers" table, read here, so the two cannot
drift). `make lint` runs this file.

Every `import` and `from ... import` of the package counts, wherever it is written: at module
top, inside a function (a lazy import is still a dependency), under TYPE_CHECKING. A module's room
is the longest room name of the table that prefixes it; a module in no room fails too, so a new
folder is placed on a floor before it lands.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = "airflow_trainpipe"
SOURCE = Path(__file__).resolve().parents[1] / "src" / PACKAGE
DOCS = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"


def floors() -> dict[str, int]:
    """Room -> floor, from the table under `## Layers` (`| floor | rooms | ... |`, bottom first)."""
    text = DOCS.read_text()
    section = text.split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rooms: dict[str, int] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].isdigit():
            for room in re.findall(r"`([a-z_.]+)`", cells[1]):
                rooms[room] = int(cells[0])
    return rooms


def modules() -> dict[str, Path]:
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = list(path.relative_to(SOURCE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(found: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a `from pkg import name` names the submodule
    when there is one)."""

    def known(name: str) -> str | None:
        while name and name not in found:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = defaultdict(set)
    for module, path in found.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in found else base for a in node.names]
            else:
                continue
            for target in targets:
                if target.split(".")[0] == PACKAGE and (hit := known(target)) and hit != module:
                    edges[module].add(hit)
    return edges


def room_of(module: str, rooms: dict[str, int]) -> str | None:
    relative = module.removeprefix(PACKAGE).removeprefix(".") or "__init__"
    matches = [r for r in rooms if relative == r or relative.startswith(r + ".")]
    return max(matches, key=len, default=None)


def cycles(edges: dict[str, set[str]], nodes: list[str]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(edges.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(nodes):
        if node not in index:
            visit(node)
    return found


def test_the_layers_table_is_there_and_names_rooms_that_exist() -> None:
    rooms, found = floors(), modules()
    assert len(rooms) >= 10, "docs/architecture.md lost its Layers table"
    for room in rooms:
        module = PACKAGE if room == "__init__" else f"{PACKAGE}.{room}"
        assert module in found, f"docs/architecture.md names room {room!r}, which is no module or package"


def test_every_module_is_in_a_room() -> None:
    rooms = floors()
    homeless = [m for m in modules() if room_of(m, rooms) is None]
    assert homeless == [], f"modules on no floor of docs/architecture.md's Layers table: {homeless}"


def test_no_import_cycle() -> None:
    found = modules()
    assert cycles(imports(found), list(found)) == []


def test_no_import_runs_up_a_layer() -> None:
    rooms, found = floors(), modules()
    upward = []
    for module, targets in sorted(imports(found).items()):
        mine = room_of(module, rooms)
        for target in sorted(targets):
            theirs = room_of(target, rooms)
            if mine and theirs and mine != theirs and rooms[theirs] >= rooms[mine]:
                upward.append(f"{module} (floor {rooms[mine]}) imports {target} (floor {rooms[theirs]})")
    assert upward == []


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"a": "from airflow_trainpipe import b", "b": "from airflow_trainpipe import a"}, [["a", "b"]]),
        (
            {"a": "def f():\n    from airflow_trainpipe.b import x", "b": "import airflow_trainpipe.a"},
            [["a", "b"]],
        ),
        ({"a": "from airflow_trainpipe import b", "b": "import os"}, []),
    ],
)
def test_the_checks_see_lazy_and_package_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source, expected
) -> None:
    # The detector itself: a cycle through a function-level import or a `from pkg import module`.
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, text in source.items():
        (package / f"{name}.py").write_text(text)
    monkeypatch.setattr(sys.modules[__name__], "SOURCE", package)
    found = modules()
    assert [[m.rpartition(".")[2] for m in c] for c in cycles(imports(found), list(found))] == expected
