"""docs/architecture.md's layout is generated from the module docstrings (scripts/architecture_layout.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import architecture_layout


def test_the_layout_in_docs_is_what_make_docs_writes() -> None:
    # Stale after a module was added, moved or removed, or a docstring's first sentence changed:
    # run `make docs`.
    assert architecture_layout.current() == architecture_layout.layout()


def test_every_module_and_folder_is_listed_with_its_first_sentence(tmp_path: Path) -> None:
    layout = architecture_layout.layout()
    for path in sorted(architecture_layout.PACKAGE.rglob("*.py")):
        if path.name != "__init__.py":
            assert f" {path.name} " in layout.replace("\n", " "), path
    assert "(no docstring)" not in layout  # every module and package says what it is for
    assert (
        "    setup.py               A training job's setup: everything it does before its first step"
        in layout
    )


@pytest.mark.parametrize(
    ("docstring", "sentence"),
    [
        ("The store. Content-addressed.", "The store"),
        ("`validation.engine: spark`. Runs GX there.", "`validation.engine: spark`"),
        ("One line\nwrapped. Next.", "One line wrapped"),
        ("No full stop at all", "No full stop at all"),
    ],
)
def test_the_first_sentence_ends_at_a_full_stop_outside_code(
    tmp_path: Path, docstring: str, sentence: str
) -> None:
    module = tmp_path / "m.py"
    module.write_text(f'"""{docstring}"""\n')
    assert architecture_layout.first_sentence(module) == sentence
