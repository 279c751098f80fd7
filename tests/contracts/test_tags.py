"""contracts/tags.py names every MLflow tag once: the names keep the values readers already stored,
and no other module of the package spells one (a scan of the source, docstrings aside)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from airflow_trainpipe.contracts import tags

SOURCE = Path(__file__).resolve().parents[2] / "src" / "airflow_trainpipe"
NAMES = {value for key, value in vars(tags).items() if key.endswith("_TAG")}
SPELLED = re.compile(r"(?<![\w.])trainpipe\.([a-z0-9_.]*)")


def test_every_name_is_ours_or_airflow_s_and_spelled_once() -> None:
    constants = [value for key, value in vars(tags).items() if key.endswith("_TAG")]
    assert len(constants) == len(NAMES)
    assert all(name.startswith((tags.PREFIX, "airflow.")) for name in NAMES)
    assert set(tags.LINEAGE_RUN_TAGS) <= NAMES and len(set(tags.LINEAGE_RUN_TAGS)) == len(
        tags.LINEAGE_RUN_TAGS
    )


def test_names_keep_the_values_stored_runs_and_versions_carry() -> None:
    # Renaming one would orphan every tag already written: readers would find nothing.
    assert tags.DATA_DIGEST_TAG == "trainpipe.data_digest"
    assert tags.CHAMPION_VERSION_TAG == "trainpipe.champion.version" and tags.NO_CHAMPION == "none"
    assert tags.GATE_FORCED_TAG == "trainpipe.gate.forced"
    assert tags.audit_tag_names("rolled_back") == (
        "trainpipe.rolled_back_by",
        "trainpipe.rolled_back_at",
        "trainpipe.rolled_back_reason",
    )


def _spelled_tags(path: Path) -> list[str]:
    """Tag names (or the bare prefix of a built one) in the module's strings, docstrings aside."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            for match in SPELLED.finditer(node.value):
                name = match.group(0).rstrip(".")
                if not match.group(1):  # f"trainpipe.{...}": a name put together at run time
                    if match.end() == len(node.value):
                        found.append(name)
                elif name in NAMES or any(n.startswith(name + ".") for n in NAMES):
                    found.append(name)
    return found


def test_no_other_module_spells_a_tag_name() -> None:
    spelled = {
        str(path.relative_to(SOURCE)): names
        for path in sorted(SOURCE.rglob("*.py"))
        # formats.py's "trainpipe.<split>:<seed>" are hash keys of stored splits, not tags.
        if path.relative_to(SOURCE).as_posix() not in ("contracts/tags.py", "contracts/formats.py")
        and (names := _spelled_tags(path))
    }
    assert spelled == {}


def test_the_scan_sees_names_prefixes_and_filters(tmp_path: Path) -> None:
    # Guards the guard: a literal, a built name and a search filter are caught; others are not.
    module = tmp_path / "m.py"
    module.write_text(
        '"""`trainpipe.data_digest` in a docstring is prose."""\n'
        'a = {"trainpipe.data_digest": 1}\n'
        'b = f"trainpipe.{action}_by"\n'
        "c = f\"tags.`trainpipe.study` = '{x}'\"\n"
        'd = "trainpipe.holdout:7"  # a hash key, not a tag\n'
        'h = "Iceberg table trainpipe.KIND"  # a table name\n'
        'e = "airflow_trainpipe.registry"\n'
    )
    assert sorted(_spelled_tags(module)) == ["trainpipe", "trainpipe.data_digest", "trainpipe.study"]
