"""What the commands share: reading config paths, running a training job here, the date."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from pathlib import Path
from typing import Any

from airflow_trainpipe.contracts.tags import LAUNCHED_BY_TAG


def config_files(paths: Sequence[str]) -> Iterator[Path]:
    from airflow_trainpipe.config import CONFIG_SUFFIXES

    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Not only regular files: a directory, FIFO or broken symlink named *.yaml is
            # reported as the DAG processor reports it, never silently skipped (nor opened).
            yield from sorted(p for p in path.rglob("*") if p.suffix in CONFIG_SUFFIXES)
        else:
            yield path


def failed(config: str, exc: Exception) -> int:
    """A config that does not load names its own file; any other error is prefixed with it."""
    from airflow_trainpipe.core.exceptions import ConfigError

    print(exc if isinstance(exc, ConfigError) else f"{config}: {exc}", file=sys.stderr)
    return 1


def run_job(spec: Any, nproc: int, *, verbose: bool, env: dict[str, str] | None = None) -> int:
    """The training job under torchrun here (launchers/runner.py), its progress printed as the
    train task logs it; `verbose`: its plain output too. Returns the job's exit code."""
    from airflow_trainpipe.core.exceptions import TrainingJobError
    from airflow_trainpipe.launchers.runner import Placement, run_training

    def show(text: str) -> None:
        print(text, flush=True)

    try:
        run_training(spec, Placement(nproc=nproc, env=env or {}, show_raw=verbose), on_line=show)
    except KeyboardInterrupt:  # the runner has killed every process of the job
        return 130
    except TrainingJobError as exc:
        print(exc, file=sys.stderr)
        return exc.exit_code or 1
    return 0


CLI_TAGS = {LAUNCHED_BY_TAG: "cli"}  # on the MLflow run of a job the CLI started


def stdout_log() -> logging.Logger:
    """The `log` the task helpers write to, printed like the command's other output (a logger of
    its own: the root logger would also print MLflow's and alembic's INFO lines)."""
    log = logging.getLogger("airflow_trainpipe.cli")
    log.handlers[:] = [logging.StreamHandler(sys.stdout)]  # today's sys.stdout (tests replace it)
    log.setLevel(logging.INFO)
    log.propagate = False
    return log


@contextmanager
def answering_soon_from_mlflow() -> Iterator[None]:
    """While a person waits on a command (promote, rollback, snapshots gc): MLflow's client
    retries an unreachable server 7 times with doubling backoff, over 4 minutes of silence before
    the error. Two retries answer in seconds; a value the user set is kept. Only for the block:
    whatever the process starts afterwards (a training job, which should ride out an outage; the
    processes of whoever called `main` in-process) keeps MLflow's default."""
    import os

    name = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
    if name in os.environ:
        yield
        return
    os.environ[name] = "2"
    try:
        yield
    finally:
        os.environ.pop(name, None)


def iso_day(text: str) -> str:
    """An argparse type: a calendar day as YYYY-MM-DD (what renders data.partition)."""
    from datetime import date

    try:
        return date.fromisoformat(text.strip()).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day (YYYY-MM-DD)") from None


def at_least(lowest: int) -> Any:
    """An argparse type: an integer of at least `lowest`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = lowest - 1
        if value < lowest:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer of at least {lowest}")
        return value

    return parse


def snapshot_digest(text: str) -> str:
    """An argparse type: a snapshot's digest, `sha256:` and 64 hex digits (the prefix may be left
    out, as some tools show a digest without it)."""
    import re

    digest = text.strip().lower()
    digest = digest if digest.startswith("sha256:") else f"sha256:{digest}"
    if re.fullmatch(r"sha256:[0-9a-f]{64}", digest) is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a snapshot digest (sha256: and 64 hex digits)")
    return digest


def today() -> str:
    from datetime import datetime

    return datetime.now(UTC).strftime("%Y-%m-%d")
