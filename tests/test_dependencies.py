"""Every third-party package the provider imports is a declared dependency, not a transitive one."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from tests.conftest import REPO_ROOT

# Runs in the Feast interpreter (.venv-feast), never in the package's own: its imports are
# constraints-feast.txt's to provide (test_the_feast_child_s_imports_are_pinned_for_its_interpreter).
FEAST_CHILD = REPO_ROOT / "src" / "airflow_trainpipe" / "data" / "feature_store" / "child.py"


def _imported_roots(folder: Path) -> set[str]:
    return set().union(*(_file_roots(path) for path in folder.rglob("*.py") if path != FEAST_CHILD))


def _file_roots(path: Path) -> set[str]:
    roots = set()
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


def test_the_feast_child_s_imports_are_pinned_for_its_interpreter() -> None:
    """What child.py imports is installed in the Feast interpreter and pinned in
    constraints-feast.txt (it must not need anything only the workers' venv has)."""
    import json
    import os
    import subprocess

    script = "import importlib.metadata as m, json; print(json.dumps(m.packages_distributions()))"
    done = subprocess.run(
        [os.environ["TRAINPIPE_FEAST_PYTHON"], "-c", script], capture_output=True, text=True, check=True
    )
    distributions = json.loads(done.stdout)
    pinned = {
        _normalise(line.split("==")[0])
        for line in (REPO_ROOT / "constraints-feast.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    roots = _file_roots(FEAST_CHILD) - set(sys.stdlib_module_names) - {"airflow_trainpipe"}
    assert {"feast", "pyarrow"} <= roots
    for root in sorted(roots):
        owners = {_normalise(d) for d in distributions.get(root, [])}
        assert owners & pinned, f"{root!r} is not installed and pinned for the Feast interpreter ({owners})"
