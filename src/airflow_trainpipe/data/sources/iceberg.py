"""The `iceberg` source: the run's window of an Apache Iceberg table at the table's current
snapshot, streamed into Parquet files in record batches.

The catalog is the one Airflow's Iceberg hook builds from the connection (`IcebergHook.catalog`:
the connection's extra holds the catalog properties, `type` among them, REST by default; its host
is the catalog URI), so a REST, SQL or Glue catalog is configured in Airflow, never here. Loading
the table fixes its current snapshot id, recorded in the manifest with the table and the row
filter; the scan names that id, so whatever writers commit meanwhile, every file read is one of
that snapshot's. pyiceberg plans the scan from the snapshot's manifests: the row filter on the
time column is projected through the partition spec (identity or a transform such as
`days(event_time)`, the table's hidden partitioning) and the files' column statistics, so files of
other days are never opened, and the rows come back with the table's columns, the time column
included (it is data, not a folder name, in Iceberg).

Reading is one data file at a time. `DataScan.to_arrow_batch_reader()` over the whole scan hands
every file to a thread pool at once and keeps each finished file's batches until they are taken:
a consumer slower than the readers (the sort) then holds the window in memory (measured on 12
files x 400k rows: 603 MiB peak against 354 MiB one file at a time). `ArrowScan.to_record_batches`
is given one planned file per call instead: memory is one data file's rows in the window plus the
sort's `file_rows`.

Bytes are a function of the rows alone: the window is sorted by `order_by` and cut into row groups
and files of fixed sizes by the sorted export the table sources share (`sorted_export`). The
exported columns have Arrow's plain types (`string`, not the `large_string` pyiceberg reads) and
no Iceberg field ids, so an export of the same rows from a Delta table or a query compares equal.

Errors name the table and the cause. An undefined connection, a table or namespace that does not
exist, a column the table lacks, a time column of another type, a window without rows and a file
of the snapshot that is gone (expired and removed while the export read it) are not retried:
another try reads the same table. A catalog or storage that cannot be reached is
(`SourceUnavailable`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.tags import DATA_FILTER_TAG, DATA_SNAPSHOT_ID_TAG, DATA_SOURCE_TAG
from airflow_trainpipe.data.sources.base import SourceDataset, window_tag
from airflow_trainpipe.data.sources.errors import SourceError, SourceUnavailable, is_refusal
from airflow_trainpipe.data.sources.parquet_export import ExportedFile
from airflow_trainpipe.data.sources.sorted_export import export_sorted
from airflow_trainpipe.data.sources.sql import airflow_connection
from airflow_trainpipe.data.sources.tables import TableKind
from airflow_trainpipe.data.sources.time_window import TimeKind, bounds, refused
from airflow_trainpipe.data.window import TimeWindow

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.config.sources import IcebergSource, TableSource
    from airflow_trainpipe.contracts.manifest import Manifest, SourceLineage

# Errors (by class name, any class of the exception's MRO) that another try may not meet: the
# catalog or the storage could not be reached, or answered that it cannot serve now.
_TRANSIENT = {
    "ConnectionError",  # requests (a REST catalog), the builtin (sockets)
    "Timeout",
    "TimeoutError",
    "ServiceUnavailableError",  # pyiceberg: REST 503
    "ServerError",  # pyiceberg: REST 5xx
    "OperationalError",  # SQLAlchemy: a SQL catalog's database
    "InterfaceError",
    "EndpointConnectionError",  # botocore: Glue
    "ConnectTimeoutError",
    "ReadTimeoutError",
}
# Errors no other try can change, whatever their class says (an OSError that is a refusal).
_REFUSED = ("forbidden", "access denied", "accessdenied", "unauthorized", "no such ", "not authorized")
_NOT_FOUND = {"NoSuchTableError", "NoSuchNamespaceError", "NoSuchIdentifierError"}
# Keywords of pyiceberg's filter syntax: a column named like one is quoted in the filter text.
_KEYWORDS = {"and", "or", "not", "is", "in", "null", "nan", "like", "between", "true", "false"}
_PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*$")
_TIME_KINDS: dict[str, TimeKind] = {
    "timestamptz": "timestamp",
    "timestamp": "timestamp_ntz",
    "date": "date",
    "string": "string",
}


@dataclass(frozen=True)
class IcebergScan:
    """The run's window of one snapshot of a table: what the export reads, what lineage records."""

    table: str
    """The table's identifier (`namespace.table`)."""
    conn_id: str
    snapshot_id: int | None
    """The table's current snapshot when it was loaded; None: the table has never held rows."""
    scan: Any
    """A `pyiceberg.table.DataScan` of the exported columns at `snapshot_id`, the filter applied."""
    filter_text: str
    """The row filter in pyiceberg's filter syntax (what `parser.parse` reads back as `scan`'s)."""
    columns: list[str]
    """Exported columns, in order."""
    schema: pa.Schema
    """The exported columns' Arrow types: plain ones, no field ids."""

    @property
    def lineage(self) -> dict[str, Any]:
        """What the manifest's SourceLineage records of the table, beside the window and filter."""
        return {"table": self.table, "snapshot_id": self.snapshot_id}

    @property
    def where(self) -> str:
        """The table at its snapshot, for messages."""
        return f"Iceberg table {self.table} (snapshot {self.snapshot_id}, catalog {self.conn_id})"


@dataclass
class IcebergExport:
    files: list[ExportedFile]
    schema: pa.Schema
    scan: IcebergScan


def _text(exc: BaseException) -> str:
    """An exception's message on one line."""
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip()) or type(exc).__name__


def _classified(exc: BaseException, where: str, doing: str) -> SourceError:
    names = {klass.__name__ for klass in type(exc).__mro__}
    text = _text(exc)
    if names & _NOT_FOUND:
        return SourceError(f"{doing} {where}: it does not exist (data.source.table): {text}")
    if isinstance(exc, FileNotFoundError):
        return SourceError(
            f"{doing} {where}: a file of the snapshot being read no longer exists (the snapshot "
            f"expired and its files were removed since it was loaded, or deleted by hand): {text}"
        )
    if not is_refusal(exc, text, _REFUSED) and (
        names & _TRANSIENT or (isinstance(exc, OSError) and "ValueError" not in names)
    ):
        return SourceUnavailable(f"{doing} {where}: {type(exc).__name__}: {text}")
    return SourceError(f"{doing} {where}: {type(exc).__name__}: {text}")


def catalog(conn_id: str) -> Any:
    """The catalog of the Airflow connection, as Airflow's Iceberg hook builds it."""
    from airflow.providers.apache.iceberg.hooks.iceberg import IcebergHook

    airflow_connection(conn_id)  # a clear error for a connection that is not defined
    try:
        return IcebergHook(iceberg_conn_id=conn_id).catalog
    except Exception as exc:
        raise _classified(exc, f"Airflow connection {conn_id!r}", "opening the Iceberg catalog of") from exc


def load_table(source: IcebergSource) -> Any:
    """The table (a `pyiceberg.table.Table`) as the catalog holds it now: its current snapshot."""
    where = f"Iceberg table {source.table} (catalog {source.conn_id})"
    found = catalog(source.conn_id)
    try:
        return found.load_table(source.table)
    except Exception as exc:
        raise _classified(exc, where, "loading") from exc


def _reference(name: str) -> str:
    """A column in pyiceberg's filter syntax: each dotted part bare or double-quoted."""
    parts = name.split(".")
    return ".".join(p if _PLAIN.match(p) and p.lower() not in _KEYWORDS else f'"{p}"' for p in parts)


def window_filter(schema: Any, column: str, window: TimeWindow, where: str) -> tuple[Any, str]:
    """`window.start <= column < window.end` as an Iceberg row filter with bounds of the column's
    own type (see `IcebergSource.time_column`), and its text: the filter is parsed from the text,
    so the text recorded is the filter the scan ran. The bounds are string literals that pyiceberg
    binds to the column's type."""
    from pyiceberg.expressions import parser

    field_type = str(schema.find_field(column).field_type)
    kind = _TIME_KINDS.get(field_type)
    if kind is None:
        raise refused(column, field_type, where)
    start, end = (value if isinstance(value, str) else value.isoformat() for value in bounds(kind, window))
    reference = _reference(column)
    text = f"{reference} >= '{start}' AND {reference} < '{end}'"
    try:
        return parser.parse(text), text
    except Exception as exc:  # pyparsing's ParseException: a name the syntax cannot quote
        raise SourceError(
            f"data.source.time_column {column!r} of {where} cannot be written in an Iceberg row filter: {exc}"
        ) from exc


def _plain(kind: pa.DataType) -> pa.DataType:
    """Arrow's plain counterpart of a large type pyiceberg reads (strings, binaries, lists)."""
    import pyarrow as pa

    if pa.types.is_large_string(kind):
        return pa.string()
    if pa.types.is_large_binary(kind):
        return pa.binary()
    if pa.types.is_large_list(kind) or pa.types.is_list(kind):
        item = kind.value_field
        return pa.list_(item.with_type(_plain(item.type)).remove_metadata())
    if pa.types.is_struct(kind):
        return pa.struct([f.with_type(_plain(f.type)).remove_metadata() for f in kind])
    if pa.types.is_map(kind):
        return pa.map_(_plain(kind.key_type), _plain(kind.item_type))
    return kind


def export_schema(schema: Any, columns: list[str]) -> pa.Schema:
    """The exported columns' Arrow schema: the table's types, plain, without field ids."""
    import pyarrow as pa
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    arrow = schema_to_pyarrow(schema.select(*columns), include_field_ids=False)
    return pa.schema([pa.field(name, _plain(arrow.field(name).type)) for name in columns])


def window_scan(source: IcebergSource, window: TimeWindow) -> IcebergScan:
    """The window of the table's current snapshot, not read yet: the columns checked, the filter
    typed after the time column."""
    table = load_table(source)
    snapshot = table.current_snapshot()
    snapshot_id = None if snapshot is None else snapshot.snapshot_id
    where = f"Iceberg table {source.table} (snapshot {snapshot_id}, catalog {source.conn_id})"
    # The snapshot's own schema: a column added since the last commit is not in its files.
    schema = table.scan(snapshot_id=snapshot_id).projection()
    names = [field.name for field in schema.fields]
    wanted = [source.time_column, *source.order_by, *(source.columns or [])]
    if missing := sorted({name for name in wanted if name not in names}, key=wanted.index):
        raise SourceError(
            f"{where} has no column {', '.join(missing)} (data.source names it); it has {', '.join(names)}"
        )
    expression, text = window_filter(schema, source.time_column, window, where)
    columns = list(source.columns or names)
    scan = table.scan(row_filter=expression, selected_fields=tuple(columns), snapshot_id=snapshot_id)
    return IcebergScan(
        table=source.table,
        conn_id=source.conn_id,
        snapshot_id=snapshot_id,
        scan=scan,
        filter_text=text,
        columns=columns,
        schema=export_schema(schema, columns),
    )


def count_rows(source: IcebergSource, window: TimeWindow) -> tuple[int, IcebergScan]:
    """Rows of the window at the current snapshot: a file whose partition lies wholly inside the
    window (and has no delete files) is counted from its manifest entry, the others read the time
    column only, one file at a time."""
    scan = window_scan(source, window)
    if scan.snapshot_id is None:
        return 0, scan
    try:
        return scan.scan.update(selected_fields=(source.time_column,)).count(), scan
    except Exception as exc:
        raise _classified(exc, scan.where, "counting the window's rows of") from exc


def rows_ready(source: IcebergSource, window: TimeWindow, min_rows: int) -> tuple[bool, str]:
    """Whether the window holds `min_rows` rows at the table's current snapshot (for the log too)."""
    rows, scan = count_rows(source, window)
    where = f"{scan.where} holds {rows} row(s) in {scan.filter_text}"
    if rows < min_rows:
        return False, f"{where}, fewer than {min_rows}"
    return True, where


def scan_batches(scan: IcebergScan) -> Iterator[pa.RecordBatch]:
    """The window's rows in record batches of the export's schema, in no particular order, one
    data file at a time (see the module's docstring), never whole."""
    from pyiceberg.io.pyarrow import ArrowScan

    if scan.snapshot_id is None:
        return
    data = scan.scan
    try:
        reader = ArrowScan(
            data.table_metadata, data.io, data.projection(), data.row_filter, data.case_sensitive
        )
        for task in data.plan_files():
            for batch in reader.to_record_batches([task]):
                if batch.num_rows:
                    yield batch.select(scan.columns).cast(scan.schema)
    except SourceError:
        raise
    except Exception as exc:
        raise _classified(exc, scan.where, "reading") from exc


def export(source: IcebergSource, window: TimeWindow, folder: Path) -> IcebergExport:
    """The window's rows, ordered by `order_by`, written as Parquet files into `folder` (not yet
    frozen); `folder/sort` holds the sort's spilled runs meanwhile."""
    return export_scan(source, window_scan(source, window), folder)


def export_scan(source: IcebergSource, scan: IcebergScan, folder: Path) -> IcebergExport:
    files, written = export_sorted(source, scan_batches(scan), scan.schema, folder, scan.where)
    if not files or written is None:
        raise SourceError(f"{scan.where} has no rows in the run's window ({scan.filter_text})")
    return IcebergExport(files=files, schema=written, scan=scan)


class IcebergKind(TableKind):
    """An Apache Iceberg table, read at its current snapshot through pyiceberg; the catalog comes
    from an Airflow connection."""

    name = "iceberg"

    def describe(self, data: DataSection) -> str:
        source = data.source
        assert source.kind == "iceberg"
        return f"data.source iceberg ({source.table}, connection {source.conn_id})"

    def source_config(self, document: Mapping[str, Any]) -> IcebergSource:
        from airflow_trainpipe.config.sources import IcebergSource

        return IcebergSource.model_validate(document)

    def rows_ready(self, source: TableSource, window: TimeWindow, min_rows: int) -> tuple[bool, str]:
        return rows_ready(source, window, min_rows)  # type: ignore[arg-type]

    def export(self, source: TableSource, window: TimeWindow, folder: Path) -> IcebergExport:
        return export(source, window, folder)  # type: ignore[arg-type]

    def lineage_tags(self, lineage: SourceLineage) -> dict[str, str]:
        """The catalog connection and the table, the snapshot id, the window and the row filter."""
        return {
            DATA_SOURCE_TAG: f"iceberg:{lineage.conn_id}/{lineage.table}",
            **window_tag(lineage),
            DATA_SNAPSHOT_ID_TAG: str(lineage.snapshot_id),
            DATA_FILTER_TAG: str(lineage.filter)[:5000],
        }

    def origin(self, lineage: SourceLineage) -> str:
        return f"{lineage.table} of catalog {lineage.conn_id} at snapshot {lineage.snapshot_id}"

    def lineage_datasets(self, data: DataSection, manifest: Manifest) -> list[SourceDataset]:
        """The table by its identifier in the catalog (the spec names no Iceberg catalog; ours is
        `iceberg://<catalog connection>`), at the snapshot read."""
        lineage = manifest.source
        assert lineage is not None and lineage.table is not None
        version = str(lineage.snapshot_id) if lineage.snapshot_id is not None else None
        return [SourceDataset(f"iceberg://{lineage.conn_id}", lineage.table, version=version)]


KIND = IcebergKind()
