"""Property: whatever the text or bytes, loading returns a config or raises ConfigError naming the file.

Inputs are valid configs (the examples) mutated the way files get damaged or attacked (lines
deleted, duplicated, swapped or re-indented, spans cut, odd characters, anchors, aliases and
merges inserted, bytes flipped), plus random YAML. Deterministic (`derandomize`), no example
database, a few seconds in all.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from airflow_trainpipe.config import PipelineConfig, load_config, parse_config
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS

SEEDS = [path.read_text() for path in sorted(EXAMPLE_CONFIGS.glob("*.yaml"))]
SOURCE = "fuzz.yaml"
# YAML's syntax characters, characters it forbids or treats specially, and multi-byte ones.
ODD = [
    *"&*!|>[]{},:?-#%@`\"'\\ \t\n\r",
    "\x00",
    "\x07",
    "\x1b",
    "\x85",
    "\ufeff",
    "\u2028",
    "\ud800",
    "é",
    "日",
    "💥",
    "<<: ",
    "&a ",
    "*a",
    "---\n",
    "...\n",
    "? ",
    "- ",
    "{",
    "[" * 50,
]
# Values that are well-formed YAML but hostile or impossible, put in place of a value.
VALUES = [
    "&x [*x]",
    "&x {k: *x}",
    "9" * 5000,
    "2026-13-45",
    "!!bool maybe",
    "!!timestamp soon",
    "!!int ten",
    "!!binary x",
    "!!python/object:os.system ls",
    "!custom 1",
    "[" * 3000 + "]" * 3000,
    "{a: " * 40 + "1" + "}" * 40,
    ".nan",
    "-.inf",
    "[" + ", ".join(["*a"] * 150) + "]",
    "0x_",
    "1e99999",
    "~",
    "''",
    "[]",
    "{}",
    "*undefined",
    '"\\ud800"',
]
PROPERTY = settings(
    max_examples=200,
    deadline=timedelta(seconds=2),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def _assert_config_or_config_error(text: str) -> None:
    try:
        assert isinstance(parse_config(text, SOURCE), PipelineConfig)
    except ConfigError as exc:
        assert exc.problems and all(problem.file == SOURCE for problem in exc.problems), exc.problems


@st.composite
def mutated_configs(draw: st.DrawFn) -> str:
    lines = draw(st.sampled_from(SEEDS)).splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 8))):
        i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
        line = lines[i]
        key, colon, value = line.partition(":")
        edit = draw(
            st.sampled_from(
                [
                    "delete",
                    "duplicate",
                    "swap",
                    "indent",
                    "dedent",
                    "tab",
                    "insert",
                    "insert",
                    "cut",
                    "value",
                    "value",
                    "anchor",
                    "alias",
                    "merge",
                    "block",
                ]
            )
        )
        if edit == "delete" and len(lines) > 1:
            del lines[i]
        elif edit == "duplicate":
            lines.insert(j, line)
        elif edit == "swap":
            lines[i], lines[j] = lines[j], line
        elif edit == "indent":
            lines[i] = " " * draw(st.integers(1, 8)) + line
        elif edit == "dedent":
            lines[i] = line.lstrip(" ")
        elif edit == "tab":
            lines[i] = "\t" + line
        elif edit == "insert":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + draw(st.sampled_from(ODD) | st.text(max_size=3)) + line[at:]
        elif edit == "cut":
            at = draw(st.integers(0, len(line)))
            lines[i] = line[:at] + line[at + draw(st.integers(1, 20)) :]
        elif edit == "block":
            lines[j:j] = lines[i : i + draw(st.integers(1, 15))]
        elif colon:  # the edits below work on `key: value` lines (the value may be the block below)
            name = draw(st.sampled_from(["a", "x"]))
            if edit == "value":
                lines[i] = f"{key}: {draw(st.sampled_from(VALUES))}\n"
            elif edit == "anchor":
                lines[i] = f"{key}: &{name}{value}"
            elif edit == "alias":
                lines[i] = f"{key}: *{name}\n"
            elif edit == "merge":
                lines.insert(i + 1, " " * (len(key) - len(key.lstrip()) + 2) + f"<<: *{name}\n")
    return "".join(lines)


@given(mutated_configs())
@PROPERTY
def test_mutated_configs_load_or_fail_naming_the_file(text: str) -> None:
    _assert_config_or_config_error(text)


_SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20) | st.dates()
_KEYS = st.sampled_from(
    ["pipeline", "schedule", "data", "training", "gate", "tags", "<<", "cron", "uri"]
) | st.text(max_size=8)
_DATA = st.recursive(
    _SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_KEYS, children, max_size=4),
    max_leaves=30,
)


@given(_DATA, st.sampled_from(["block", "flow", "shared", "cyclic"]))
@settings(PROPERTY, max_examples=150)
def test_random_yaml_loads_or_fails_naming_the_file(data: object, shape: str) -> None:
    if isinstance(data, dict):
        data = {"pipeline": "fuzzed", **data}
    if shape == "shared":
        data = [data, data]  # the dumper writes the second as an alias of the first
    elif shape == "cyclic":
        data = [data]
        data.append(data)  # dumped as `&id001 [..., *id001]`
    _assert_config_or_config_error(
        yaml.safe_dump(data, default_flow_style=shape == "flow", allow_unicode=True)
    )


@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 4000), st.binary(min_size=1, max_size=4)), max_size=4),
)
@settings(PROPERTY, max_examples=100)
def test_bytes_on_disk_load_or_fail_naming_the_file(seed: str, edits: list[tuple[int, bytes]]) -> None:
    data = bytearray(seed.encode())
    for at, chunk in edits:
        data[at : at + len(chunk)] = chunk
    fd, name = tempfile.mkstemp(suffix=".yaml")
    try:
        os.write(fd, bytes(data))
        os.close(fd)
        try:
            assert isinstance(load_config(Path(name)), PipelineConfig)
        except ConfigError as exc:
            assert exc.problems and all(problem.file == name for problem in exc.problems), exc.problems
    finally:
        os.unlink(name)
