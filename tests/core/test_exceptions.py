"""exceptions: located config problems, ConfigError's message, and which errors are retryable."""

from __future__ import annotations

import pytest

from airflow_trainpipe.core.exceptions import (
    ConfigError,
    ConfigProblem,
    PayloadError,
    TrainingJobError,
    TrainpipeError,
)


def _problem(line: int | None = 3, column: int | None = 7, path: str = "gate.metric") -> ConfigProblem:
    return ConfigProblem("p.yaml", line, column, path, "not a metric")


@pytest.mark.parametrize(
    ("line", "column", "path", "text"),
    [
        (3, 7, "gate.metric", "p.yaml:3:7: gate.metric: not a metric"),
        (3, None, "gate.metric", "p.yaml:3: gate.metric: not a metric"),
        (None, 7, "gate.metric", "p.yaml: gate.metric: not a metric"),
        (None, None, "", "p.yaml: <document>: not a metric"),
    ],
)
def test_a_problem_reads_file_line_column_path_message(
    line: int | None, column: int | None, path: str, text: str
) -> None:
    assert str(_problem(line, column, path)) == text


def test_a_config_error_lists_one_problem_per_line() -> None:
    error = ConfigError([_problem(), _problem(9, None, "owner")], pipeline="fraud")
    assert str(error) == "p.yaml:3:7: gate.metric: not a metric\np.yaml:9: owner: not a metric"
    assert (error.file, error.pipeline, len(error.problems)) == ("p.yaml", "fraud", 2)


def test_a_config_error_keeps_its_own_copy_of_the_problems() -> None:
    problems = [_problem()]
    error = ConfigError(problems)
    problems.append(_problem(4))
    assert len(error.problems) == 1 and error.pipeline is None


def test_a_config_error_without_problems_is_a_bug() -> None:
    with pytest.raises(ValueError, match="ConfigError needs at least one problem"):
        ConfigError([])


def test_an_unexpected_exception_becomes_one_document_problem() -> None:
    error = ConfigError.unexpected("p.yaml", "loading it", KeyError("x"), pipeline="fraud")
    [problem] = error.problems
    assert (problem.file, problem.line, problem.column, problem.path) == ("p.yaml", None, None, "")
    assert problem.message == "unexpected KeyError while loading it: 'x'; the traceback is logged"
    assert error.pipeline == "fraud"


def test_an_unexpected_exception_shows_only_its_first_line() -> None:
    error = ConfigError.unexpected("p.yaml", "parsing", RuntimeError("  first line\nsecond line\n"))
    assert (
        error.problems[0].message
        == "unexpected RuntimeError while parsing: first line; the traceback is logged"
    )


def test_an_unexpected_exception_without_a_message_names_only_its_type() -> None:
    error = ConfigError.unexpected("p.yaml", "parsing", RecursionError())
    assert error.problems[0].message == "unexpected RecursionError while parsing; the traceback is logged"


@pytest.mark.parametrize(("length", "shown"), [(200, 200), (201, 199)])
def test_a_long_exception_message_is_cut_at_200_characters(length: int, shown: int) -> None:
    message = ConfigError.unexpected("p.yaml", "x", ValueError("e" * length)).problems[0].message
    detail = message.removeprefix("unexpected ValueError while x: ").removesuffix("; the traceback is logged")
    assert detail == "e" * shown + ("…" if shown < length else "")


@pytest.mark.parametrize(
    ("error", "retryable"),
    [(TrainpipeError("x"), False), (PayloadError("x"), False), (TrainingJobError("x"), True)],
)
def test_only_errors_another_try_can_fix_are_retryable(error: TrainpipeError, retryable: bool) -> None:
    assert error.retryable is retryable


def test_config_errors_are_never_retried() -> None:
    assert ConfigError([_problem()]).retryable is False
