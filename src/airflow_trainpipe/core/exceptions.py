"""The package's exception hierarchy: every message names the thing that failed."""

from __future__ import annotations

from dataclasses import dataclass


class TrainpipeError(Exception):
    """Base class of every error this package raises on purpose.

    `retryable` says whether another try of the task can succeed (a store or server that comes
    back, data that is still arriving); tasks fail at once on the others (bad data, a bad value,
    a missing run), whatever their `retries`. The package's operators raise these errors as they
    are and their retry policy reads the flag (`retry_policy.TrainpipeRetryPolicy`); an instance
    may set its own `retryable` where only the raiser knows.
    """

    retryable = False


@dataclass(frozen=True)
class ConfigProblem:
    """One problem in one pipeline config file, located as precisely as the YAML allows."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return f"{where}: {self.path or '<document>'}: {self.message}"


class ConfigError(TrainpipeError):
    """A pipeline config file is invalid; `problems` lists every problem found in it."""

    def __init__(self, problems: list[ConfigProblem], pipeline: str | None = None):
        if not problems:
            raise ValueError("ConfigError needs at least one problem")
        self.problems = list(problems)
        # The `pipeline:` the file declares when it got that far (a stand-in DAG may take it).
        self.pipeline = pipeline
        super().__init__("\n".join(str(p) for p in self.problems))

    @classmethod
    def unexpected(cls, source: str, doing: str, exc: Exception, pipeline: str | None = None) -> ConfigError:
        """An exception no check foresaw (a bug, or hostile input), as one short problem.

        The caller logs the traceback; the message only names the exception and the stage.
        """
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if len(detail) > 200:
            detail = detail[:199] + "…"
        message = f"unexpected {type(exc).__name__} while {doing}{': ' + detail if detail else ''}; the traceback is logged"
        return cls([ConfigProblem(source, None, None, "", message)], pipeline=pipeline)

    @property
    def file(self) -> str:
        return self.problems[0].file


class TrainingJobError(TrainpipeError):
    """A training job could not run or finish (its pods, its world size, its ranks' errors); the
    message names it. Retryable unless the job said otherwise (a rank's bad-data error)."""

    retryable = True  # a new try starts new processes, possibly on other nodes

    def __init__(self, message: str, *, retryable: bool = True, exit_code: int | None = None):
        super().__init__(message)
        self.retryable = retryable
        self.exit_code = exit_code
        """The job's exit code, when it ran here (`trainpipe train` exits with it)."""


class PayloadError(TrainpipeError):
    """What a task received from another task is not the payload it expects."""


class RegistryError(TrainpipeError):
    """The model registry or tracking server answered with an error, or not at all."""


class RegistryUnavailable(RegistryError):
    """The registry could not be asked; retrying later can succeed."""

    retryable = True
