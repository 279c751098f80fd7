"""`data.source` and `snapshots`: where a run's rows come from, and where they are frozen.

A `files` source is today's layout: the run's partition of Parquet/CSV files under `data.uri`.
A `sql` source is a query on an Airflow connection, rendered with the run's window and exported,
streamed, into Parquet files in the content-addressed snapshot store: what was validated and
trained on stays readable after the table changes. A `delta` source is the window's rows of a
Delta Lake table at its current version, frozen the same way: reproducing never needs the
table's history (a vacuum deletes old versions' files). An `iceberg` source is the window's rows of
an Apache Iceberg table at its current snapshot, read through a catalog an Airflow connection
defines, frozen the same way (an expired snapshot cannot change what was trained on).
"""

from __future__ import annotations

import re
from typing import Annotated, ClassVar, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.templates import template_syntax_error
from airflow_trainpipe.config.types import ColumnName, StorageUri


class FilesSource(Section):
    """The run's partition `<data.uri>/<partition>/` of Parquet or CSV files (the default)."""

    kind: Literal["files"] = "files"
    """`files`: Parquet or CSV files under `data.uri`, one partition per run."""

    rows_from: ClassVar[str] = ""


class SqlSource(Section):
    """Rows of a query on an Airflow connection, frozen into Parquet per run.

    PostgreSQL and SQLite are read through ADBC, streamed; any other DB-API connection through
    its hook's cursor."""

    kind: Literal["sql"]
    """`sql`: a query on an Airflow connection."""

    rows_from: ClassVar[str] = " from the query"
    """How the DAG's docs say where `wait.min_rows` rows are counted."""

    @property
    def origin(self) -> str:
        """What the rows are read from, for the DAG's docs (the connection by id only; the query
        stays in the config and the run's manifest)."""
        return f"a query on connection `{self.conn_id}`"

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
        if problem := template_syntax_error(value):
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

IcebergIdentifier = Annotated[str, Field(max_length=1024, pattern=r"^[^.\s][^.]*(\.[^.\s][^.]*)+$")]
"""`namespace.table`: dot-separated, no empty part, at least a namespace and a table."""


class DeltaSource(Section):
    """The run's window of a Delta Lake table at its current version, frozen into Parquet per run.

    Read through delta-rs (the `deltalake` package: no Spark, no JVM); the manifest records the
    table, the version and the filter."""

    kind: Literal["delta"]
    """`delta`: a Delta Lake table."""

    rows_from: ClassVar[str] = " from the table"

    @property
    def origin(self) -> str:
        return f"Delta table `{self.uri}` at its current version"

    uri: StorageUri
    """The table's root (the folder holding `_delta_log/`): `s3://bucket/table`,
    `file:///abs/table`, or a path relative to TRAINPIPE_HOME."""

    time_column: ColumnName
    """Column the window filters on: the run's rows have `window_start <= time_column <
    window_end` (the run's day, or `data.window.partitions` x `data.window.every` ending with it).
    A timestamp compares as an instant (one without a time zone is read as UTC); a date as its
    midnight UTC; a string as ISO 8601 text in UTC (`2026-01-05`, `2026-01-05T06:00:00`), compared
    with `YYYY-MM-DD` bounds when the window is whole days, else `YYYY-MM-DDTHH:MM:SS`. A
    partition column works (its files are pruned, not read); any other type is refused."""

    order_by: list[ColumnName] = Field(min_length=1)
    """Columns that order the rows completely (a unique key): the same rows then always give the
    same bytes and digest, whatever files the table spreads them over. The export fails naming
    the first two rows that tie."""

    columns: list[ColumnName] | None = Field(default=None, min_length=1)
    """Columns to export, in this order; null: every column of the table, partition columns
    included, in the table's order. Must include `order_by`."""

    batch_rows: PositiveInt = 65_536
    """Rows per record batch read from the table and written as one Parquet row group."""

    file_rows: PositiveInt = 1_048_576
    """Rows per frozen Parquet file. Also the export's memory bound: the window is sorted this
    many rows at a time (runs larger windows spill to local disk under TRAINPIPE_HOME and merge)."""

    conn_id: str | None = Field(default=None, min_length=1)
    """Airflow AWS connection whose credentials, region and endpoint read an `s3://` table; null:
    the environment's (`AWS_*` variables, an instance role). Local tables need none."""

    @model_validator(mode="after")
    def _columns_hold_the_key(self) -> DeltaSource:
        field_problems(_columns_problems(self.columns, self.order_by))
        return self


def _columns_problems(columns: list[str] | None, order_by: list[str]) -> FieldProblems:
    """A table source's `columns` lists each column once and holds the sort key."""
    if columns is None:
        return []
    problems: FieldProblems = []
    if len(set(columns)) != len(columns):
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        problems.append((("columns",), f"lists {', '.join(repeated)} more than once"))
    if missing := [c for c in order_by if c not in columns]:
        problems.append(
            (
                ("columns",),
                f"must include the order_by column(s) {', '.join(missing)}: the export sorts by them",
            )
        )
    return problems


class IcebergSource(Section):
    """The run's window of an Iceberg table at its current snapshot, frozen into Parquet per run.

    Read through pyiceberg (no Spark, no JVM) from the catalog of an Airflow `iceberg` connection
    (REST, SQL, Glue, Hive...: the connection says which); the manifest records the table, the
    snapshot id and the row filter."""

    kind: Literal["iceberg"]
    """`iceberg`: an Apache Iceberg table."""

    rows_from: ClassVar[str] = " from the table"

    @property
    def origin(self) -> str:
        return f"Iceberg table `{self.table}` of connection `{self.conn_id}` at its current snapshot"

    conn_id: str = Field(min_length=1)
    """Airflow connection of type `iceberg` that defines the catalog (its URI, credentials and
    properties stay in Airflow, never in the config). Airflow's Iceberg hook names the catalog
    after the connection: a SQL catalog finds the tables created under that catalog name."""

    table: IcebergIdentifier
    """The table's identifier in the catalog, `namespace.table` (`analytics.card_transactions`;
    a nested namespace: `a.b.table`)."""

    time_column: ColumnName
    """Column the window filters on: the run's rows have `window_start <= time_column <
    window_end` (the run's day, or `data.window.partitions` x `data.window.every` ending with it).
    A `timestamptz` compares as an instant, a `timestamp` (without a zone) as an instant in UTC; a
    date as its midnight UTC; a string as ISO 8601 text in UTC (`2026-01-05`,
    `2026-01-05T06:00:00`), compared with `YYYY-MM-DD` bounds when the window is whole days, else
    `YYYY-MM-DDTHH:MM:SS`. A table partitioned on it, by identity or a transform (`days(ts)`,
    `hours(ts)`, `months(ts)`), has its other partitions' files pruned, not read; any other type
    is refused."""

    order_by: list[ColumnName] = Field(min_length=1)
    """Columns that order the rows completely (a unique key): the same rows then always give the
    same bytes and digest, whatever data files the snapshot spreads them over. The export fails
    naming the first two rows that tie."""

    columns: list[ColumnName] | None = Field(default=None, min_length=1)
    """Columns to export, in this order; null: every top-level column of the snapshot's schema,
    in its order. Must include `order_by`."""

    batch_rows: PositiveInt = 65_536
    """Rows per Parquet row group of the export (record batches are read as the data files hold
    them)."""

    file_rows: PositiveInt = 1_048_576
    """Rows per frozen Parquet file. Also the export's memory bound: the window is sorted this
    many rows at a time (runs larger windows spill to local disk under TRAINPIPE_HOME and merge)."""

    @model_validator(mode="after")
    def _columns_hold_the_key(self) -> IcebergSource:
        field_problems(_columns_problems(self.columns, self.order_by))
        return self


TableSource = DeltaSource | IcebergSource
"""A table read at one version (snapshot) and exported sorted by `order_by`."""

DataSource = FilesSource | SqlSource | DeltaSource | IcebergSource


class SnapshotsSection(Section):
    """The content-addressed store every non-file source (`sql`, `delta`, `iceberg`) is frozen into, once per run."""

    uri: StorageUri = "snapshots"
    """Store root: `s3://bucket/prefix`, `file:///abs/path`, or a path relative to TRAINPIPE_HOME.
    Files are named by their sha256, so two runs that export the same rows share them."""
