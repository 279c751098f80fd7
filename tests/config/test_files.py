"""Reading a config file: whatever sits in the folder, a ConfigError naming it, never a hang."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.config.files import read_config_text
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS


def _error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    [problem] = caught.value.problems
    assert problem.file == str(path)
    return str(problem)


def test_a_directory_named_like_a_config(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").mkdir()
    assert (
        _error(tmp_path / "x.yaml")
        == f"{tmp_path / 'x.yaml'}: <document>: cannot read file: it is a directory, not a config file"
    )


@pytest.mark.timeout(20)  # reading a FIFO blocks until a writer comes: a hang, not a failure
def test_a_named_pipe_is_not_opened_for_a_blocking_read(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "x.yaml")
    assert _error(tmp_path / "x.yaml").endswith("cannot read file: it is a named pipe, not a config file")


def test_symlink_loop_and_dangling_symlink(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").symlink_to("b.yaml")
    (tmp_path / "b.yaml").symlink_to("a.yaml")
    (tmp_path / "dangling.yaml").symlink_to("gone.yaml")
    assert _error(tmp_path / "a.yaml").endswith("cannot read file: it is a symlink loop")
    assert _error(tmp_path / "dangling.yaml").endswith(
        "cannot read file: it is a symlink to 'gone.yaml', which does not exist"
    )


def test_a_symlink_to_a_config_still_loads(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").symlink_to(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    assert load_config(tmp_path / "x.yaml").pipeline == "fraud_detector"


def test_bytes_that_are_not_utf8_are_located(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_bytes("pipeline: a\nowner: caf\xe9\n".encode("latin-1"))
    assert _error(tmp_path / "x.yaml").endswith(
        "cannot read file: not UTF-8 text: byte 0xe9 at line 2, column 11 (invalid continuation byte); save the file as UTF-8"
    )


def test_utf16_is_named(tmp_path: Path) -> None:
    (tmp_path / "x.yaml").write_text("pipeline: a\n", encoding="utf-16")
    assert _error(tmp_path / "x.yaml").endswith(
        "cannot read file: it is UTF-16 text (it starts with a UTF-16 byte order mark); save it as UTF-8"
    )


def test_a_path_no_file_can_have_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="cannot read file: embedded null byte"):
        read_config_text("a\x00.yaml")
