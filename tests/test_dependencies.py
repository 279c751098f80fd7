"""Every third-party package the provider imports is a declared dependency, not a transitive one."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.conftest import REPO_ROOT


def _imported_roots(folder: Path) -> set[str]:
    roots = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                roots.add(node.module.split(".")[0])
    return roots


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_direct_imports_are_declared_dependencies() -> None:
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    # An extra (spark) declares what its lazily imported backend needs; `test` is not the package's.
    extras = [
        spec for name, specs in project["optional-dependencies"].items() if name != "test" for spec in specs
    ]
    declared = {
        _normalise(re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0]) for spec in project["dependencies"] + extras
    }
    distributions = packages_distributions()
    missing = {}
    for root in sorted(_imported_roots(REPO_ROOT / "src" / "airflow_trainpipe")):
        if root in sys.stdlib_module_names or root == "airflow_trainpipe":
            continue
        owners = {_normalise(d) for d in distributions.get(root, [])}
        assert owners, f"nothing installed provides {root!r}"
        if not owners & declared and not any(o.startswith("apache-airflow") for o in owners):
            missing[root] = sorted(owners)
    assert missing == {}, f"imported but only transitive: {missing}; declare them in pyproject.toml"
