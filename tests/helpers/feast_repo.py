"""A real Feast repo for the tests, built as `trainpipe make-data --feast` builds one (DuckDB
offline store over the Parquet feature tables, SQLite online store) and applied with the Feast
interpreter ($TRAINPIPE_FEAST_PYTHON; tests/conftest.py defaults it to .venv-feast)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from airflow_trainpipe.examples.feast_repo import FeastExample, write_feast_example

START = date(2026, 1, 1)


def feast_repo(
    root: Path, days: int = 3, rows: int = 2000, seed: int = 1, start: date = START
) -> FeastExample:
    """The example under `root`: `days` days of `rows` labelled transactions from `start`, the card
    and merchant feature tables and the applied repo (about 7 s, most of it `import feast`)."""
    return write_feast_example(root, start, days, rows, seed=seed)
