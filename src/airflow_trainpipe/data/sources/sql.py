"""The `sql` source: the run's window of a query, streamed into Parquet files in record batches.

PostgreSQL and SQLite are read through ADBC (`fetch_record_batch`: Arrow batches straight from
the driver; PostgreSQL's arrive through binary COPY), any other DB-API connection through its
Airflow hook's cursor, `fetchmany` at a time. Nothing holds the whole result: memory is a few
batches whatever the window's size. Airflow's `DbApiHook.get_df_by_chunks` and
`SqlToS3Operator` read the whole result first (1.94 GB for 2M x 20 on PostgreSQL, measured for
the issue), so they are not used.

Bytes are a function of the rows alone: the query is wrapped in `ORDER BY data.source.order_by`,
row groups are cut at exactly `batch_rows` rows (not at the driver's batch boundaries) and files at
`file_rows`, so the same rows always give the same files and digest. A tie in the ordering key
would let the database order those rows either way: the export fails naming it.

Window bounds enter the query as literals, not bind parameters: with parameters ADBC's
PostgreSQL driver cannot stream (it prepares the statement and fetches the result whole). The
literals are formatted here from datetimes, never from text a user typed, so they cannot inject.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from airflow_trainpipe.core.exceptions import TrainpipeError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.config.sources import SqlSource, TableSource

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


class SourceError(TrainpipeError):
    """The source cannot give the run's rows: a wrong query, a missing connection, no rows."""


class SourceUnavailable(SourceError):
    """The database could not be reached or dropped the connection: another try may succeed."""

    retryable = True


@dataclass(frozen=True)
class SqlWindow:
    """The run's half-open period `[start, end)` of rows."""

    start: datetime
    end: datetime

    def names(self) -> dict[str, str]:
        """What the query template sees: complete, quoted SQL literals."""
        return {
            "window_start": f"'{self.start.isoformat()}'",
            "window_end": f"'{self.end.isoformat()}'",
            "window_start_date": f"'{self.start.date().isoformat()}'",
            "window_end_date": f"'{self.end.date().isoformat()}'",
        }


def run_window(
    data: DataSection, context: Mapping[str, Any], partition: str, render: Callable, slots: int | None = None
) -> SqlWindow:
    """The run's slot, or the `data.window.partitions` slots ending with it (`slots`: that many).

    A slot is `every` long (a day by default) and starts at the run's logical date floored to a
    multiple of `every` (midnight UTC for days, the hour for hours); a backfill's partition chosen
    in the trigger form moves it to the date that renders that partition."""
    from airflow_trainpipe.data.window import anchored

    end_context = anchored(context, partition, lambda moved: str(render(data.partition, moved)))
    moment = end_context.get("logical_date") or datetime.fromisoformat(str(end_context["ds"]))
    # A plain UTC datetime: Airflow's context holds pendulum's, whose intervals do not divide.
    moment = datetime.fromtimestamp(
        (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp(), UTC
    )
    every = data.window.every if data.window is not None else timedelta(days=1)
    count = slots or (data.window.partitions if data.window is not None else 1)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    end = epoch + every * ((moment - epoch) // every) + every
    return SqlWindow(start=end - every * count, end=end)


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


@dataclass
class ExportedFile:
    path: Path
    rows: int


class ParquetExport:
    """Cuts an ordered stream of batches into row groups of exactly `batch_rows` rows and files of
    `file_rows` (rounded up to whole row groups), checking the ordering key for ties as it goes."""

    def __init__(self, source: SqlSource | TableSource, folder: Path):
        self.source, self.folder = source, folder
        self.files: list[ExportedFile] = []
        self.schema: pa.Schema | None = None
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._writer: Any = None
        self._last_key: tuple[Any, ...] | None = None
        self._rows_seen = 0
        self._groups_per_file = max(1, -(-source.file_rows // source.batch_rows))

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        if self.schema is None:
            self.schema = batch.schema
            missing = [name for name in self.source.order_by if name not in batch.schema.names]
            if missing:
                raise SourceError(
                    f"data.source.order_by names {', '.join(missing)}, which the query does not return "
                    f"(it returns {', '.join(batch.schema.names)})"
                )
        self._check_ties(batch)
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        while self._pending_rows >= self.source.batch_rows:
            self._write_group(self.source.batch_rows)

    def finish(self) -> list[ExportedFile]:
        if self._pending_rows:
            self._write_group(self._pending_rows)
        self._close_file()
        return self.files

    def _write_group(self, rows: int) -> None:
        import pyarrow as pa

        table = pa.Table.from_batches(self._pending, schema=self.schema)
        group, rest = table.slice(0, rows), table.slice(rows)
        if self._writer is None or self.files[-1].rows >= self._groups_per_file * self.source.batch_rows:
            self._open_file()
        self._writer.write_table(group, row_group_size=rows)
        self.files[-1].rows += rows
        self._pending = rest.to_batches()
        self._pending_rows = rest.num_rows

    def _open_file(self) -> None:
        import pyarrow.parquet as pq

        self._close_file()
        path = self.folder / f"part-{len(self.files):05d}.parquet"
        self._writer = pq.ParquetWriter(path, self.schema)
        self.files.append(ExportedFile(path, 0))

    def _close_file(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _check_ties(self, batch: pa.RecordBatch) -> None:
        """Vectorised: a row equal to the one before it on every key column (nulls tie with
        nulls, NaN with NaN: the database sorts them together in no defined order), within the
        batch and across the boundary with the previous batch."""
        import pyarrow as pa
        import pyarrow.compute as pc

        columns = [batch.column(name) for name in self.source.order_by]
        first = tuple(c[0].as_py() for c in columns)
        tie_at = 0 if self._last_key is not None and _same_key(first, self._last_key) else None
        if tie_at is None and batch.num_rows > 1:
            same = pa.array([True] * (batch.num_rows - 1))
            for column in columns:
                later, earlier = column.slice(1), column.slice(0, batch.num_rows - 1)
                equal = pc.fill_null(pc.equal(later, earlier), False)
                both_null = pc.and_(pc.is_null(later), pc.is_null(earlier))
                if pa.types.is_floating(column.type):
                    both_nan = pc.fill_null(pc.and_(pc.is_nan(later), pc.is_nan(earlier)), False)
                    both_null = pc.or_(both_null, both_nan)
                same = pc.and_(same, pc.or_(equal, both_null))
            if pc.any(same).as_py():
                tie_at = pc.index(same, True).as_py() + 1
        if tie_at is not None:
            key = tuple(c[tie_at].as_py() for c in columns)
            row = self._rows_seen + tie_at
            raise SourceError(
                f"data.source.order_by ({', '.join(self.source.order_by)}) does not order the rows "
                f"completely: rows {row - 1} and {row} of the result both have "
                f"{dict(zip(self.source.order_by, key, strict=True))}; add columns until the key is "
                "unique, or the same rows could give other bytes"
            )
        self._last_key = tuple(c[batch.num_rows - 1].as_py() for c in columns)
        self._rows_seen += batch.num_rows


def _same_key(one: tuple[Any, ...], other: tuple[Any, ...]) -> bool:
    # NaN != NaN in Python too, and it ties in the ORDER BY like a repeated value.
    return all(a == b or (a != a and b != b) for a, b in zip(one, other, strict=True))


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
