"""Every file in tests/config/broken/ is rejected with its file, line, field path and reason.

Each file states what it expects in its header:
    # expect-path: gate.direction
    # expect-line: 41
    # expect-message: did you mean 'maximize'
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from airflow_trainpipe.cli import main
from airflow_trainpipe.config import load_config
from airflow_trainpipe.core.exceptions import ConfigError

BROKEN = sorted((Path(__file__).parent / "broken").glob("*.yaml"))


def _expectation(path: Path) -> tuple[str, int, str]:
    header = dict(re.findall(r"^# expect-([a-z]+): ?(.*)$", path.read_text(), re.MULTILINE))
    return header["path"], int(header["line"]), header["message"]


def test_there_are_at_least_30_broken_configs() -> None:
    assert len(BROKEN) >= 30


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_broken_config_is_reported_with_file_line_and_field(path: Path) -> None:
    field_path, line, message = _expectation(path)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    matching = [p for p in caught.value.problems if p.path == field_path and message in p.message]
    assert matching, f"no problem at {field_path!r} containing {message!r}; got:\n{caught.value}"
    problem = matching[0]
    assert problem.file == str(path)
    assert problem.line == line, str(problem)
    assert str(problem).startswith(f"{path}:{line}:")


@pytest.mark.parametrize("path", BROKEN, ids=[p.stem for p in BROKEN])
def test_check_cli_exits_1_with_one_line_per_problem(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _field_path, line, message = _expectation(path)
    assert main(["check", str(path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out, "no problem printed"
    assert all(entry.startswith(f"{path}:") for entry in out)
    assert any(f"{path}:{line}:" in entry and message in entry for entry in out), out


def test_check_cli_reports_every_broken_file_in_a_folder(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(BROKEN[0].parent)]) == 1
    out = capsys.readouterr().out
    assert {p.name for p in BROKEN} <= {Path(line.split(":", 1)[0]).name for line in out.splitlines()}
