"""The `delta` source: the run's window of a Delta Lake table, at the table's current version,
streamed into Parquet files in record batches.

The table is read through delta-rs (the `deltalake` package: no Spark, no JVM). Opening it fixes
a version, recorded in the manifest with the table and the filter; every file read is one of that
version's, whatever writers commit meanwhile. `DeltaTable.to_pyarrow_dataset` gives each data file
as a fragment whose partition expression holds the file's partition values (and its column
statistics), so the scanner prunes the files of other days without opening them and restores the
partition columns Delta data files do not carry, typed as the table's schema says (a `date`
partition column comes back as date32, not as the text of its folder name).

Bytes are a function of the rows alone: the window is sorted by `order_by` and cut into row
groups and files of fixed sizes by the sorted export the table sources share (`sorted_export`:
an external sort, about `file_rows` rows in memory whatever the window's size).

Errors name the table and the cause. A missing table, a version whose data files are gone (a
vacuum while the export read it, or files deleted by hand), a window without rows and a column
the table lacks are not retried: another try reads the same table. A storage outage is
(`SourceUnavailable`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_trainpipe.contracts.tags import DATA_FILTER_TAG, DATA_SOURCE_TAG, DATA_TABLE_VERSION_TAG
from airflow_trainpipe.core.storage import is_local, local_path, resolve
from airflow_trainpipe.data.sources.base import SourceDataset, window_tag
from airflow_trainpipe.data.sources.errors import SourceError, SourceUnavailable, is_refusal
from airflow_trainpipe.data.sources.parquet_export import ExportedFile
from airflow_trainpipe.data.sources.sorted_export import export_sorted
from airflow_trainpipe.data.sources.tables import TableKind
from airflow_trainpipe.data.sources.time_window import TimeKind, bounds, refused
from airflow_trainpipe.data.window import TimeWindow

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from airflow_trainpipe.config.data import DataSection
    from airflow_trainpipe.config.sources import DeltaSource, TableSource
    from airflow_trainpipe.contracts.manifest import Manifest, SourceLineage

# delta-rs colours its error chains for a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Storage refusals that another try would only repeat.
_REFUSED = (
    "forbidden",
    "access denied",
    "accessdenied",
    "invalidaccesskeyid",
    "signaturedoesnotmatch",
)
# Scanner read-ahead: a few batches and files in flight, not the defaults' 16 x 4.
_BATCH_READAHEAD = 4
_FRAGMENT_READAHEAD = 2


@dataclass(frozen=True)
class WindowScan:
    """The run's window of one version of a table: what the export reads, what lineage records."""

    table: str
    """The table's URI (relative paths resolved under TRAINPIPE_HOME)."""
    version: int
    dataset: ds.Dataset
    filter: pc.Expression
    columns: list[str]
    """Exported columns, in order."""

    @property
    def filter_text(self) -> str:
        return str(self.filter)

    @property
    def lineage(self) -> dict[str, Any]:
        """What the manifest's SourceLineage records of the table, beside the window and filter."""
        return {"table": self.table, "version": self.version}


@dataclass
class DeltaExport:
    files: list[ExportedFile]
    schema: pa.Schema
    scan: WindowScan


def _text(exc: BaseException) -> str:
    """An exception's message on one line, without delta-rs's colours and tree marks."""
    lines = (line.strip().lstrip("↳").strip() for line in _ANSI.sub("", str(exc)).splitlines())
    return " ".join(line for line in lines if line) or type(exc).__name__


def _classified(exc: BaseException, table: str, doing: str) -> SourceError:
    from deltalake.exceptions import DeltaProtocolError, TableNotFoundError

    text = _text(exc)
    if isinstance(exc, TableNotFoundError):
        return SourceError(f"no Delta table at {table} (data.source.uri): {text}")
    if isinstance(exc, DeltaProtocolError):
        return SourceError(f"{doing} {table}: the table needs a reader feature this reader lacks: {text}")
    if isinstance(exc, FileNotFoundError):
        return SourceError(
            f"{doing} {table}: a data file of the version being read no longer exists (vacuumed "
            f"since the version was opened, or deleted by hand): {text}"
        )
    if isinstance(exc, OSError) and not is_refusal(exc, text, _REFUSED):
        return SourceUnavailable(f"{doing} {table}: {text}")
    return SourceError(f"{doing} {table}: {type(exc).__name__}: {text}")


def _location(uri: str) -> str:
    """What delta-rs opens: a local path (a file:// URI's escapes undone), else the URI."""
    return str(local_path(uri)) if is_local(uri) else uri


def storage_options(uri: str, conn_id: str | None) -> dict[str, str] | None:
    """delta-rs's object-store options for an `s3://` table from an Airflow AWS connection:
    its credentials (a role it assumes included), region and endpoint. None: the environment's."""
    if conn_id is None or is_local(uri):
        return None
    if urlsplit(uri).scheme not in ("s3", "s3a"):
        raise SourceError(
            f"data.source.conn_id {conn_id!r}: credentials from an Airflow connection are read for "
            f"s3:// tables only; {uri} reads its storage's credentials from the environment"
        )
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    from airflow_trainpipe.data.sources.sql import airflow_connection

    airflow_connection(conn_id)  # a clear error for a connection that is not defined
    hook = S3Hook(aws_conn_id=conn_id)
    try:
        credentials = hook.get_credentials()
        region = hook.conn_region_name or hook.get_session().region_name
    except Exception as exc:
        raise SourceUnavailable(f"credentials of Airflow connection {conn_id!r}: {_text(exc)}") from exc
    options = {"AWS_ACCESS_KEY_ID": credentials.access_key, "AWS_SECRET_ACCESS_KEY": credentials.secret_key}
    if credentials.token:
        options["AWS_SESSION_TOKEN"] = credentials.token
    if region:
        options["AWS_REGION"] = region
    if endpoint := hook.conn_config.get_service_endpoint_url(service_name="s3"):
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    return options


def window_filter(field: pa.Field, window: TimeWindow, table: str) -> pc.Expression:
    """`window.start <= field < window.end`, with bounds of the field's own type (see
    `DeltaSource.time_column`): compared in Arrow, so a partition column prunes whole files."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = field.type
    category: TimeKind
    if pa.types.is_timestamp(kind):
        # An instant; a timestamp without a time zone (Delta's timestamp_ntz) is read as UTC.
        category = "timestamp" if kind.tz else "timestamp_ntz"
    elif pa.types.is_date(kind):
        category = "date"
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        category = "string"
    else:
        raise refused(field.name, str(kind), table)
    start, end = bounds(category, window)
    column = pc.field(field.name)
    return (column >= pa.scalar(start, type=kind)) & (column < pa.scalar(end, type=kind))


def open_table(source: DeltaSource) -> Any:
    """The table at its current version (a `deltalake.DeltaTable`)."""
    from deltalake import DeltaTable

    table = resolve(source.uri)
    options = storage_options(table, source.conn_id)
    try:
        return DeltaTable(_location(table), storage_options=options)
    except Exception as exc:
        raise _classified(exc, table, "opening") from exc


def window_scan(source: DeltaSource, window: TimeWindow) -> WindowScan:
    """The window of the table's current version, not read yet: the columns checked, the filter
    typed after the time column."""
    table = resolve(source.uri)
    delta = open_table(source)
    version = delta.version()
    try:
        dataset = delta.to_pyarrow_dataset()
    except Exception as exc:
        raise _classified(exc, table, f"reading version {version} of") from exc
    names = dataset.schema.names
    wanted = [source.time_column, *source.order_by, *(source.columns or [])]
    if missing := sorted({name for name in wanted if name not in names}, key=wanted.index):
        raise SourceError(
            f"{table} (version {version}) has no column {', '.join(missing)} (data.source names it); "
            f"it has {', '.join(names)}"
        )
    return WindowScan(
        table=table,
        version=version,
        dataset=dataset,
        filter=window_filter(dataset.schema.field(source.time_column), window, table),
        columns=list(source.columns or names),
    )


def count_rows(source: DeltaSource, window: TimeWindow) -> tuple[int, WindowScan]:
    """Rows of the window at the current version: a file the log's statistics place wholly inside
    the window is counted from its Parquet footer, the others stream the time column only."""
    scan = window_scan(source, window)
    try:
        return scan.dataset.count_rows(filter=scan.filter, batch_size=source.batch_rows), scan
    except Exception as exc:
        raise _classified(
            exc, scan.table, f"counting the window's rows of version {scan.version} of"
        ) from exc


def rows_ready(source: DeltaSource, window: TimeWindow, min_rows: int) -> tuple[bool, str]:
    """Whether the window holds `min_rows` rows at the table's current version (for the log too)."""
    rows, scan = count_rows(source, window)
    where = f"{scan.table} (version {scan.version}) holds {rows} row(s) in {scan.filter_text}"
    if rows < min_rows:
        return False, f"{where}, fewer than {min_rows}"
    return True, where


def scan_batches(scan: WindowScan, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """The window's rows in record batches, in no particular order, never whole."""
    scanner = scan.dataset.scanner(
        columns=scan.columns,
        filter=scan.filter,
        batch_size=batch_rows,
        batch_readahead=_BATCH_READAHEAD,
        fragment_readahead=_FRAGMENT_READAHEAD,
    )
    try:
        for batch in scanner.to_batches():
            if batch.num_rows:
                yield batch
    except Exception as exc:
        raise _classified(exc, scan.table, f"reading version {scan.version} of") from exc


def export(source: DeltaSource, window: TimeWindow, folder: Path) -> DeltaExport:
    """The window's rows, ordered by `order_by`, written as Parquet files into `folder` (not yet
    frozen); `folder/sort` holds the sort's spilled runs meanwhile."""
    scan = window_scan(source, window)
    return export_scan(source, scan, folder)


def export_scan(source: DeltaSource, scan: WindowScan, folder: Path) -> DeltaExport:
    import pyarrow as pa

    schema = pa.schema([scan.dataset.schema.field(name) for name in scan.columns])
    batches = scan_batches(scan, source.batch_rows)
    files, written = export_sorted(source, batches, schema, folder, scan.table)
    if not files or written is None:
        raise SourceError(
            f"{scan.table} (version {scan.version}) has no rows in the run's window ({scan.filter_text})"
        )
    return DeltaExport(files=files, schema=written, scan=scan)


class DeltaKind(TableKind):
    """A Delta Lake table, read at its current version through delta-rs."""

    name = "delta"

    def describe(self, data: DataSection) -> str:
        source = data.source
        assert source.kind == "delta"
        return f"data.source delta ({source.uri})"

    def source_config(self, document: Mapping[str, Any]) -> DeltaSource:
        from airflow_trainpipe.config.sources import DeltaSource

        return DeltaSource.model_validate(document)

    def rows_ready(self, source: TableSource, window: TimeWindow, min_rows: int) -> tuple[bool, str]:
        return rows_ready(source, window, min_rows)  # type: ignore[arg-type]

    def export(self, source: TableSource, window: TimeWindow, folder: Path) -> DeltaExport:
        return export(source, window, folder)  # type: ignore[arg-type]

    def lineage_tags(self, lineage: SourceLineage) -> dict[str, str]:
        """The table, the version its rows were read at, the window and the row filter."""
        return {
            DATA_SOURCE_TAG: f"delta:{lineage.table}",
            **window_tag(lineage),
            DATA_TABLE_VERSION_TAG: str(lineage.version),
            DATA_FILTER_TAG: str(lineage.filter)[:5000],  # MLflow caps a tag value
        }

    def origin(self, lineage: SourceLineage) -> str:
        return f"{lineage.table} at version {lineage.version}"

    def lineage_datasets(self, data: DataSection, manifest: Manifest) -> list[SourceDataset]:
        """The table by its location (as Spark's OpenLineage integration names Delta tables), at
        the version read."""
        from airflow_trainpipe.core.storage import dataset_name

        lineage = manifest.source
        assert lineage is not None and lineage.table is not None
        return [SourceDataset(*dataset_name(lineage.table), version=str(lineage.version))]


KIND = DeltaKind()
