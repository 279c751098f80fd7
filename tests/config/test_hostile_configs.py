"""Hostile config files: each one is a ConfigError naming the file and the problem, within the limits' work.

`hostile/` holds the cases that can live in git, one file each; `generated_cases` creates the
others (a directory named like a config, symlink loops, a FIFO, files over the size limit, odd
file names). tests/factory/test_dagbag.py puts each beside a valid config in a real DagBag.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.config.limits import MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.config_work import MAX_EVENTS, Work, counted_work

HOSTILE_DIR = Path(__file__).parent / "hostile"
_DEPTH = f"nesting depth {MAX_DEPTH + 1} is over the limit of {MAX_DEPTH} levels"
_NODES = f"over the limit of {MAX_NODES:,}"
_SIZE = f"over the limit of {MAX_FILE_BYTES:,} bytes"

# file in hostile/ -> what its first problem says
HOSTILE = {
    "alias_depth_chain.yaml": _DEPTH + " (through alias *a29)",
    "bad_merge.yaml": "schedule: invalid merge: expected a mapping or list of mappings for merging, but found scalar",
    "billion_laughs.yaml": "nodes once alias *a2 is expanded are " + _NODES,
    "binary_garbage.yaml": "cannot read file: not UTF-8 text: byte 0x8b at line 1, column 2",
    "control_characters.yaml": "invalid YAML: unacceptable character #x001b: control characters are not allowed",
    "deep_block_nesting.yaml": _DEPTH,
    "deep_flow_nesting.yaml": _DEPTH,
    "duplicate_anchor.yaml": "invalid YAML: anchor &a is defined again (first on line 3)",
    "empty.yaml": "expected a mapping of config sections, got an empty file",
    "huge_integer.yaml": "training.hyperparameters.seed: invalid value: not a valid int: Exceeds the limit (4300 digits)",
    "impossible_date.yaml": "schedule.start_date: invalid value: not a valid timestamp: month must be in 1..12",
    "invalid_pipeline_name.yaml": "pipeline: expected pipeline name; becomes the Airflow DAG id",
    "long_tag.yaml": "tags[0]: String should have at most 100 characters",
    "many_aliases.yaml": f"alias {MAX_ALIASES + 1} (*x) is over the limit of {MAX_ALIASES} aliases per file",
    "merge_bomb.yaml": "nodes once alias *m9 is expanded are " + _NODES,
    "multiple_documents.yaml": "invalid YAML: a second document starts here; a config file is one YAML document",
    "non_string_keys.yaml": "keys must be strings, got '1'",
    "not_utf8.yaml": "cannot read file: not UTF-8 text: byte 0xe9 at line 3, column 13",
    "nul_byte.yaml": "invalid YAML: unacceptable character #x0000: control characters are not allowed",
    "overlong_pipeline_name.yaml": "pipeline: String should have at most 250 characters",
    "recursive_alias.yaml": "alias *x refers to a node that contains it; a config cannot be recursive",
    "tab_indentation.yaml": "invalid YAML: found a tab character that violates indentation",
    "tagged_bool.yaml": "schedule.catchup: invalid value: not a valid bool",
    "undefined_alias.yaml": "invalid YAML: found undefined alias 'nobody'",
    "utf16.yaml": "cannot read file: it is UTF-16 text",
    "yaml_list.yaml": "expected a mapping of config sections, got a list",
    "yaml_scalar.yaml": "expected a mapping of config sections, got a str",
}


def _write(name: bytes | str, text: str) -> Callable[[Path], None]:
    def write(folder: Path) -> None:
        raw = name if isinstance(name, bytes) else name.encode()
        Path(os.fsdecode(os.fsencode(folder) + b"/" + raw)).write_text(text)

    return write


def _symlinks(*links: tuple[str, str]) -> Callable[[Path], None]:
    def make(folder: Path) -> None:
        for name, target in links:
            (folder / name).symlink_to(target)

    return make


def generated_cases() -> dict[str, tuple[Callable[[Path], None], str]]:
    """The cases git cannot hold: {file name as shown: (writes it into a folder, what its problem says)}."""
    fraud = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    loop = _symlinks(("loop_a.yaml", "loop_b.yaml"), ("loop_b.yaml", "loop_a.yaml"))
    return {
        "directory.yaml": (
            lambda folder: (folder / "directory.yaml").mkdir(),
            "cannot read file: it is a directory, not a config file",
        ),
        "loop_a.yaml": (loop, "cannot read file: it is a symlink loop"),
        "dangling.yaml": (
            _symlinks(("dangling.yaml", "gone.yaml")),
            "cannot read file: it is a symlink to 'gone.yaml', which does not exist",
        ),
        "fifo.yaml": (
            lambda folder: os.mkfifo(folder / "fifo.yaml"),
            "cannot read file: it is a named pipe, not a config file",
        ),
        # 100,000 levels crash libyaml's C composer (SIGSEGV): the whole DAG processor, not a file.
        "deep_100k.yaml": (
            _write("deep_100k.yaml", "pipeline: evil\ntags: " + "[" * 100_000 + "]" * 100_000 + "\n"),
            _DEPTH,
        ),
        "oversized.yaml": (
            _write("oversized.yaml", "#" * MAX_FILE_BYTES + "\n" + fraud),
            f"file is {MAX_FILE_BYTES + 1 + len(fraud.encode()):,} bytes, " + _SIZE,
        ),
        "huge_scalar.yaml": (
            _write("huge_scalar.yaml", fraud.replace("owner: risk-ml", "owner: " + "x" * 1_000_000)),
            _SIZE,
        ),
        "big_scalar.yaml": (
            _write("big_scalar.yaml", fraud.replace("retries: 2", "retries: " + "9" * 3000 + "x" * 200_000)),
            "schedule.retries: Input should be a valid integer, got '99999",
        ),
        "esc\\x1b[31m.yaml": (_write(b"esc\x1b[31m.yaml", "pipeline: [\n"), "invalid YAML"),
        "caf\\xe9.yaml": (_write(b"caf\xe9.yaml", "pipeline: [\n"), "invalid YAML"),
        "n" * 250 + ".yaml": (_write("n" * 250 + ".yaml", "pipeline: [\n"), "invalid YAML"),
    }


def make_generated(folder: Path) -> dict[str, str]:
    """Write every generated case into `folder`: {file name as shown: what its problem says}."""
    expected = {}
    for shown, (write, message) in generated_cases().items():
        write(folder)
        expected[shown] = message
    return expected


def test_every_hostile_file_has_an_expectation() -> None:
    assert sorted(p.name for p in HOSTILE_DIR.iterdir()) == sorted(HOSTILE)


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_file_is_one_config_error_within_the_limits_work(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = HOSTILE_DIR / name
    with counted_work(monkeypatch) as work, pytest.raises(ConfigError) as caught:
        load_config(path)
    assert _within_limits(work), work
    first = caught.value.problems[0]
    assert first.file == str(path) and HOSTILE[name] in str(first), str(caught.value)
    assert len(str(first)) < 400


def _within_limits(work: Work) -> bool:
    return work.events <= MAX_EVENTS and work.bytes_read <= MAX_FILE_BYTES + 1


@pytest.mark.timeout(60)  # the FIFO: a blocking read would hang here
def test_generated_hostile_files_are_config_errors_within_the_limits_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = make_generated(tmp_path)
    failures = []
    for shown, message in expected.items():
        path = (
            tmp_path / shown
            if "\\x" not in shown
            else next(p for p in tmp_path.iterdir() if p.name.startswith(shown[:3]))
        )
        with counted_work(monkeypatch) as work:
            try:
                load_config(path)
                failures.append(f"{shown}: loaded")
            except ConfigError as exc:
                if message not in str(exc.problems[0]) or len(str(exc.problems[0])) > 800:
                    failures.append(f"{shown}: {str(exc)[:300]}")
        if not _within_limits(work):
            failures.append(f"{shown}: {work}")
    assert not failures, "\n".join(failures)
