"""Limits on a config's size and shape: a hostile file is one located ConfigError, found within the limits' work."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_trainpipe.config import load_config, parse_config
from airflow_trainpipe.config.limits import MAX_ALIASES, MAX_DEPTH, MAX_FILE_BYTES, MAX_NODES
from airflow_trainpipe.core.exceptions import ConfigError, ConfigProblem
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.config_work import AT_EVERY_LIMIT_NODES, MAX_EVENTS, Work, at_every_limit, counted_work

FRAUD = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
# `training.deepspeed.overrides` is free-form: the one place a valid config may nest at will.
# The root mapping is depth 1, `training` 2, `deepspeed` 3, `overrides` 4.


@pytest.fixture
def work(monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    with counted_work(monkeypatch) as counted:
        yield counted


def _problem(text: str, work: Work) -> ConfigProblem:
    """The one problem of `text`, found before composing past the limits: a limit stops the work early."""
    work.events = 0
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "x.yaml")
    assert work.events <= MAX_EVENTS
    [problem] = caught.value.problems
    assert problem.file == "x.yaml"
    return problem


def _with_overrides(value: str) -> str:
    assert "overrides:" not in FRAUD
    return FRAUD.replace("    precision: auto\n", f"    precision: auto\n    overrides: {value}\n")


def test_the_examples_are_far_below_every_limit() -> None:
    for path in EXAMPLE_CONFIGS.glob("*.yaml"):
        assert path.stat().st_size * 20 < MAX_FILE_BYTES
        load_config(path)  # loads, so under MAX_DEPTH (they nest 7 deep) and MAX_NODES (~300 nodes)


def test_a_self_referencing_alias_is_a_cycle(work: Work) -> None:
    problem = _problem("pipeline: evil\ntags: &x [*x]\n", work)
    assert (problem.line, problem.column) == (2, 11)
    assert problem.message == "alias *x refers to a node that contains it; a config cannot be recursive"


def test_nesting_is_limited_before_it_is_composed(work: Work) -> None:
    inside = MAX_DEPTH - 4  # `overrides` and the mappings in it, then a scalar leaf at exactly MAX_DEPTH
    assert parse_config(_with_overrides("{a: " * inside + "1" + "}" * inside)).training.deepspeed.overrides
    problem = _problem(_with_overrides("{a: " * (inside + 1) + "1" + "}" * (inside + 1)), work)
    assert problem.message == f"nesting depth {MAX_DEPTH + 1} is over the limit of {MAX_DEPTH} levels"


@pytest.mark.parametrize("depth", [1_000, 20_000])
def test_deep_nesting_is_stopped_at_the_limit(depth: int, work: Work) -> None:
    problem = _problem("pipeline: evil\ntags: " + "[" * depth + "]" * depth + "\n", work)
    # Parsing stopped at the limit: the rest of the text (libyaml's scanner is quadratic on
    # deep nesting: 20,000 levels cost 2.5 s) was never scanned.
    assert work.events <= MAX_DEPTH + 10
    assert problem.line == 2 and f"over the limit of {MAX_DEPTH} levels" in problem.message


def test_nesting_through_aliases_counts(work: Work) -> None:
    # Flat on the page, 41 deep once expanded: the walk would recurse through every level.
    chain = "a0: &a0 [1]\n" + "".join(f"a{i}: &a{i} [*a{i - 1}]\n" for i in range(1, 41))
    problem = _problem("pipeline: evil\n" + chain, work)
    assert problem.message.startswith(
        f"nesting depth {MAX_DEPTH + 1} is over the limit of {MAX_DEPTH} levels"
    )
    assert "through alias *a" in problem.message


def test_billion_laughs_stops_at_the_node_limit(work: Work) -> None:
    lol = "a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    lol += "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10))
    problem = _problem("pipeline: evil\n" + lol, work)
    assert problem.line == 5  # a3's aliases of a2 (1,111 nodes each) take the total over MAX_NODES
    assert f"over the limit of {MAX_NODES:,}" in problem.message and "alias *a2" in problem.message


def test_a_merge_key_bomb_stops_at_the_node_limit(work: Work) -> None:
    bomb = "m0: &m0 {k: v}\n" + "".join(
        f"m{i}: &m{i} {{<<: [*m{i - 1}, *m{i - 1}], k{i}: v}}\n" for i in range(1, 40)
    )
    problem = _problem("pipeline: evil\n" + bomb, work)
    assert f"over the limit of {MAX_NODES:,}" in problem.message


def test_alias_count_is_limited(work: Work) -> None:
    many = "a: &a 1\nb: [" + ", ".join(["*a"] * (MAX_ALIASES + 5)) + "]\n"
    problem = _problem("pipeline: evil\n" + many, work)
    assert problem.message.startswith(
        f"alias {MAX_ALIASES + 1} (*a) is over the limit of {MAX_ALIASES} aliases"
    )


def test_node_count_is_limited_without_aliases(work: Work) -> None:
    problem = _problem("pipeline: evil\ntags: [" + "x, " * MAX_NODES + "]\n", work)
    assert f"over the limit of {MAX_NODES:,}" in problem.message


def test_file_size_is_limited_before_reading(tmp_path: Path, work: Work) -> None:
    # Sparse: 40 MB that cost nothing to create, and ~1 s to read and scan if anything did.
    big = tmp_path / "big.yaml"
    with open(big, "wb") as handle:
        handle.truncate(40_000_000)
    with pytest.raises(ConfigError) as caught:
        load_config(big)
    assert (work.bytes_read, work.events) == (0, 0)
    assert (
        str(caught.value)
        == f"{big}: <document>: file is 40,000,000 bytes, over the limit of {MAX_FILE_BYTES:,} bytes"
    )


def test_text_size_is_limited_in_utf8_bytes(work: Work) -> None:
    at_limit = "#" * (MAX_FILE_BYTES - len(FRAUD) - 1) + "\n" + FRAUD
    assert parse_config(at_limit).pipeline == "fraud_detector"
    over = "é" + at_limit[1:]  # one character, two bytes
    assert (
        _problem(over, work).message
        == f"file is {MAX_FILE_BYTES + 1:,} bytes, over the limit of {MAX_FILE_BYTES:,} bytes"
    )


def test_a_file_at_every_limit_is_read_composed_and_validated_whole(tmp_path: Path, work: Work) -> None:
    # The worst a file within the limits can cost: the full node budget, at the full size.
    # How fast it loads is a benchmark (`make bench`, "Config parsing"), not a bound here.
    path = tmp_path / "x.yaml"
    path.write_text(at_every_limit(FRAUD))
    with pytest.raises(ConfigError, match="x_tags") as caught:
        load_config(path)
    # Only the unknown key is wrong: no limit refused it, so it was validated whole.
    [problem] = caught.value.problems
    assert problem.path == "x_tags" and "over the limit" not in problem.message
    assert work.bytes_read == MAX_FILE_BYTES
    assert AT_EVERY_LIMIT_NODES < work.events <= MAX_EVENTS
