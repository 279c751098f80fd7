"""`data.source` and `snapshots`: where a run's rows come from, and where they are frozen.

A `files` source is today's layout: the run's partition of Parquet/CSV files under `data.uri`.
A `sql` source is a query on an Airflow connection, rendered with the run's window and exported,
streamed, into Parquet files in the content-addressed snapshot store: what was validated and
trained on stays readable after the table changes.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, PositiveInt, field_validator

from airflow_trainpipe.config.base import Section
from airflow_trainpipe.config.types import ColumnName, StorageUri


class FilesSource(Section):
    """The run's partition `<data.uri>/<partition>/` of Parquet or CSV files (the default)."""

    kind: Literal["files"] = "files"
    """`files`: Parquet or CSV files under `data.uri`, one partition per run."""


class SqlSource(Section):
    """Rows of a query on an Airflow connection, frozen into Parquet per run.

    PostgreSQL and SQLite are read through ADBC, streamed; any other DB-API connection through
    its hook's cursor."""

    kind: Literal["sql"]
    """`sql`: a query on an Airflow connection."""

    conn_id: str = Field(min_length=1)
    """Airflow connection of the database (its credentials stay in Airflow, never in the config)."""

    query: str = Field(min_length=1)
    """SELECT of the run's rows, a Jinja template. `{{ window_start }}` and `{{ window_end }}` are
    the run's half-open window `[start, end)` as quoted ISO timestamp literals
    (`'2026-01-05T00:00:00+00:00'`), `{{ window_start_date }}`/`{{ window_end_date }}` as quoted
    dates (`'2026-01-05'`); `ds` and the other date names of the run are there too. The window is
    the run's day, or `data.window.partitions` x `data.window.every` ending with it."""

    order_by: list[ColumnName] = Field(min_length=1)
    """Columns that order the result completely (a unique key): the same rows then always give the
    same bytes and digest. The export fails naming the first two rows that tie."""

    batch_rows: PositiveInt = 65_536
    """Rows per record batch read from the database and written as one Parquet row group."""

    file_rows: PositiveInt = 1_048_576
    """Rows per frozen Parquet file (a file is the unit the store shares between snapshots)."""

    @field_validator("query")
    @classmethod
    def _one_select(cls, value: str) -> str:
        from airflow_trainpipe.config.data import _template_syntax_error

        if problem := _template_syntax_error(value):
            raise ValueError(f"invalid Airflow template: {problem}")
        if ";" in value.strip().rstrip(";"):
            raise ValueError("expected one SELECT statement; the query holds a ';' between statements")
        return value

    @field_validator("order_by")
    @classmethod
    def _plain_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if not _IDENTIFIER.match(name):
                raise ValueError(
                    f"order_by column {name!r} is not a plain identifier (letters, digits, '_'); "
                    "alias it in the query"
                )
        return value


# Quoted into the ORDER BY the export appends: a name that needs no escaping in any SQL dialect.
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

DataSource = FilesSource | SqlSource


class SnapshotsSection(Section):
    """The content-addressed store every non-file source is frozen into, once per run."""

    uri: StorageUri = "snapshots"
    """Store root: `s3://bucket/prefix`, `file:///abs/path`, or a path relative to TRAINPIPE_HOME.
    Files are named by their sha256, so two runs that export the same rows share them."""
