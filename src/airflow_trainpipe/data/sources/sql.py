"""The `sql` source (`SqlKind`): the run's window of a query, waited for with a `COUNT(*)` the
database runs, and streamed into Parquet files in record batches.

PostgreSQL and SQLite are read through ADBC (`fetch_record_batch`: Arrow batches straight from
the driver; PostgreSQL's arrive through binary COPY), any other DB-API connection through its
Airflow hook's cursor, `fetchmany` at a time. Nothing holds the whole result: memory is a few
batches whatever the window's size. Airflow's `DbApiHook.get_df_by_chunks` and
`SqlToS3Operator` read the whole result first (1.94 GB for 2M x 20 on PostgreSQL, measured for
the issue), so they are not used.

Bytes are a function of the rows alone: the query is wrapped in `ORDER BY data.source.order_by`
and the ordered batches are cut into row groups and files of fixed sizes by `parquet_export`,
which also fails naming a tie in the ordering key (the database could order those rows either
way).

Window bounds enter the query as literals, not bind parameters: with parameters ADBC's
PostgreSQL driver cannot stream (it prepares the statement and fetches the result whole). The
literals are formatted here from datetimes, never from text a user typed, so they cannot inject.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from airflow_trainpipe.contracts.tags import DATA_QUERY_SHA256_TAG, DATA_SOURCE_TAG
from airflow_trainpipe.data.sources.base import (
    QUERY_REMEDY,
    Render,
    SourceDataset,
    SourceKind,
    freeze_export,
    window_tag,
)
from airflow_trainpipe.data.sources.errors import SourceError, SourceUnavailable
from airflow_trainpipe.data.sources.parquet_export import ExportedFile, ParquetExport
from airflow_trainpipe.data.window import TimeWindow, run_time_window

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_trainpipe.config import PipelineConfig
    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.config.sources import SqlSource
    from airflow_trainpipe.contracts.manifest import Manifest, SourceLineage

POSTGRES_TYPES = ("postgres", "postgresql")
SQLITE_TYPES = ("sqlite",)
# libpq connection parameters a connection's extras may carry into the ADBC URI.
_LIBPQ_EXTRAS = (
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "connect_timeout",
    "application_name",
    "options",
    "target_session_attrs",
    "keepalives",
    "keepalives_idle",
)


def statement(query: str) -> str:
    """The rendered query without the trailing `;` a subquery cannot have."""
    return query.strip().rstrip(";").rstrip()


def ordered(query: str, order_by: list[str]) -> str:
    keys = ", ".join(f'"{name}"' for name in order_by)
    return f"SELECT * FROM (\n{statement(query)}\n) AS trainpipe_source ORDER BY {keys}"


def counted(query: str) -> str:
    return f"SELECT COUNT(*) FROM (\n{statement(query)}\n) AS trainpipe_source"


def airflow_connection(conn_id: str) -> Any:
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(conn_id)
    except Exception as exc:  # AirflowNotFoundException, or a secrets backend's own error
        if type(exc).__name__ == "AirflowNotFoundException":
            raise SourceError(
                f"Airflow connection {conn_id!r} is not defined (data.source.conn_id)"
            ) from None
        raise SourceUnavailable(f"reading Airflow connection {conn_id!r}: {exc}") from exc


def postgres_uri(conn: Any) -> str:
    user = quote(conn.login or "", safe="")
    password = f":{quote(conn.password, safe='')}" if conn.password else ""
    auth = f"{user}{password}@" if user or password else ""
    extras = {k: str(v) for k, v in conn.extra_dejson.items() if k in _LIBPQ_EXTRAS}
    query = f"?{urlencode(extras)}" if extras else ""
    return f"postgresql://{auth}{conn.host or 'localhost'}:{conn.port or 5432}/{quote(conn.schema or '', safe='')}{query}"


def sqlite_path(conn: Any) -> str | None:
    """An Airflow sqlite connection's database file: `host` (its documented URI form), else `schema`."""
    return conn.host or conn.schema


@contextmanager
def connect(conn_id: str) -> Iterator[tuple[Any, bool]]:
    """A DB-API connection for the Airflow connection, and whether it is ADBC (Arrow batches)."""
    conn = airflow_connection(conn_id)
    kind = (conn.conn_type or "").lower()
    try:
        if kind in POSTGRES_TYPES:
            import adbc_driver_postgresql.dbapi as adbc_pg

            db = adbc_pg.connect(postgres_uri(conn))
        elif kind in SQLITE_TYPES:
            import adbc_driver_sqlite.dbapi as adbc_sqlite

            path = sqlite_path(conn)
            if not path or not Path(path).is_file():
                raise SourceError(f"connection {conn_id!r}: SQLite database {path!r} does not exist")
            db = adbc_sqlite.connect(path)
        else:
            db = conn.get_hook().get_conn()
    except SourceError:
        raise
    except Exception as exc:
        raise _classified(exc, f"connecting to {conn_id!r} ({kind})") from exc
    try:
        yield db, kind in (*POSTGRES_TYPES, *SQLITE_TYPES)
    finally:
        db.close()


def _classified(exc: BaseException, doing: str) -> SourceError:
    """Connection trouble is retried; a query the database refuses is not (another try sends the
    same text). DB-API drivers name their classes alike; SQLite files the refusals of a wrong
    query (no such table or column, a syntax error) under OperationalError too."""
    name, text = type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    refused = any(word in text.lower() for word in ("no such ", "syntax error", "does not exist"))
    cls = SourceUnavailable if name in ("OperationalError", "InterfaceError") and not refused else SourceError
    return cls(f"{doing}: {name}: {text}")


def count_rows(conn_id: str, query: str) -> int:
    """Rows the run's query returns now: the sensor's completion check, run in the database."""
    with connect(conn_id) as (db, _):
        cursor = db.cursor()
        try:
            cursor.execute(counted(query))
            row = cursor.fetchone()
        except Exception as exc:
            raise _classified(exc, f"counting the rows of the query on {conn_id!r}") from exc
        finally:
            cursor.close()
    return int(row[0]) if row else 0


def rows_ready(conn_id: str, query: str, min_rows: int) -> tuple[bool, str]:
    """Whether the run's query returns `min_rows` rows yet, and what it returns (for the log)."""
    rows = count_rows(conn_id, query)
    if rows < min_rows:
        return False, f"the query on {conn_id!r} returns {rows} row(s), fewer than {min_rows}"
    return True, f"the query on {conn_id!r} returns {rows} row(s)"


def batches(db: Any, adbc: bool, query: str, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The ordered result in Arrow record batches, never whole."""
    import pyarrow as pa

    cursor = db.cursor()
    try:
        cursor.execute(query)
        if adbc:
            yield from cursor.fetch_record_batch()
            return
        names = [column[0] for column in cursor.description]
        schema: pa.Schema | None = None
        while rows := cursor.fetchmany(batch_rows):
            table = pa.table(list(map(list, zip(*rows, strict=True))), names=names)
            schema = schema or table.schema
            yield from table.cast(schema).to_batches()
    finally:
        cursor.close()


def export(source: SqlSource, query: str, folder: Path) -> tuple[list[ExportedFile], pa.Schema]:
    """The ordered result of `query` written as Parquet files into `folder` (not yet frozen)."""
    out = ParquetExport(source, folder)
    with connect(source.conn_id) as (db, adbc):
        try:
            for batch in batches(db, adbc, ordered(query, source.order_by), source.batch_rows):
                out.add(batch)
        except SourceError:
            raise
        except Exception as exc:
            raise _classified(exc, f"running the query on {source.conn_id!r}") from exc
    files = out.finish()
    if not files or out.schema is None:
        raise SourceError(f"the query on {source.conn_id!r} returned no rows for the run's window")
    return files, out.schema


class SqlKind(SourceKind):
    """A query on an Airflow connection, rendered with the run's window; waited for with a
    `COUNT(*)` the database runs over the run's own slot."""

    name = "sql"

    def describe(self, data: DataSection) -> str:
        return f"data.source sql ({_source(data).conn_id})"

    def query(
        self,
        data: DataSection,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        *,
        own_slot: bool = False,
    ) -> tuple[TimeWindow, str]:
        """The run's window and its query, the window filled in; with `own_slot`, the run's own
        day (slot) only: what `wait_for_data` waits for, as it waits for a files run's own partition."""
        window = run_time_window(data, context, partition, render, slots=1 if own_slot else None)
        return window, str(render(_source(data).query, {**context, **window.names()}))

    def wait(
        self,
        data: DataSection,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> dict[str, Any]:
        _, query = self.query(data, context, partition, render, own_slot=True)
        return {"conn_id": _source(data).conn_id, "query": query, "min_rows": data.wait.min_rows or 1}

    def ready(self, wait: Mapping[str, Any]) -> tuple[bool, str]:
        return rows_ready(wait["conn_id"], wait["query"], wait["min_rows"])

    def snapshot(
        self,
        config: PipelineConfig,
        context: Mapping[str, Any],
        partition: str,
        render: Render,
        conn_id: str | None,
    ) -> Manifest:
        """Export the window's rows, freeze the files, and store the manifest that reads them."""
        from airflow_trainpipe.contracts.manifest import SourceLineage

        source = _source(config.data)
        window, query = self.query(config.data, context, partition, render)

        def exported(folder: Path) -> tuple[list[ExportedFile], pa.Schema, SourceLineage]:
            files, schema = export(source, query, folder)
            lineage = SourceLineage(
                kind="sql",
                conn_id=source.conn_id,
                query=query,
                window_start=window.start.isoformat(),
                window_end=window.end.isoformat(),
            )
            return files, schema, lineage

        return freeze_export(config, partition, exported, QUERY_REMEDY, conn_id)

    def lineage_tags(self, lineage: SourceLineage) -> dict[str, str]:
        """The connection, the window and the query's hash (the manifest keeps the query)."""
        import hashlib

        return {
            DATA_SOURCE_TAG: f"sql:{lineage.conn_id}",
            **window_tag(lineage),
            DATA_QUERY_SHA256_TAG: hashlib.sha256((lineage.query or "").encode()).hexdigest(),
        }

    def lineage_datasets(self, data: DataSection, manifest: Manifest) -> list[SourceDataset]:
        """The tables the window's query read, as OpenLineage names them: `postgres://host:port`
        and `database.schema.table`; `sqlite://<file>` and the table (the spec names no SQLite).
        The tables come from the OpenLineage provider's SQL parser (`openlineage-sql`)."""
        from airflow.providers.openlineage.sqlparser import SQLParser

        lineage = manifest.source
        assert lineage is not None and lineage.conn_id is not None and lineage.query is not None
        conn = airflow_connection(lineage.conn_id)
        kind = (conn.conn_type or "").lower()
        if kind in SQLITE_TYPES:
            namespace, database, schema, dialect = f"sqlite://{sqlite_path(conn)}", None, None, "sqlite"
        else:
            scheme = "postgres" if kind in POSTGRES_TYPES else kind
            namespace = f"{scheme}://{conn.host or 'localhost'}:{conn.port or DEFAULT_PORTS.get(kind, '')}"
            database, schema, dialect = conn.schema, "public" if kind in POSTGRES_TYPES else None, scheme
        parsed = SQLParser(dialect=dialect, default_schema=schema).parse(lineage.query)
        tables = parsed.in_tables if parsed is not None else []
        return [
            SourceDataset(namespace, ".".join(p for p in (database, table.schema or schema, table.name) if p))
            for table in tables
        ]


def _source(data: DataSection) -> SqlSource:
    """`data.source`, which the kind's lookup guarantees is a `sql` one."""
    from airflow_trainpipe.config.sources import SqlSource

    source = data.source
    assert isinstance(source, SqlSource)
    return source


DEFAULT_PORTS = {"postgres": 5432, "postgresql": 5432, "mysql": 3306}

KIND = SqlKind()
