"""The `delta` source: the run's window of a Delta Lake table, at the table's current version,
streamed into Parquet files in record batches.

The table is read through delta-rs (the `deltalake` package: no Spark, no JVM). Opening it fixes
a version, recorded in the manifest with the table and the filter; every file read is one of that
version's, whatever writers commit meanwhile. `DeltaTable.to_pyarrow_dataset` gives each data file
as a fragment whose partition expression holds the file's partition values (and its column
statistics), so the scanner prunes the files of other days without opening them and restores the
partition columns Delta data files do not carry, typed as the table's schema says (a `date`
partition column comes back as date32, not as the text of its folder name).

Bytes are a function of the rows alone. A scanner is not ordered (fragments come in the log's
order, which a rewrite of the same rows changes), so the export sorts the window by `order_by`
and fails on a tie (`ParquetExport`, shared with the `sql` source, cuts row groups of exactly
`batch_rows` and files of `file_rows`). The sort is external: the window is read `file_rows` rows
at a time, each run is sorted in memory and, if the window holds more than one, spilled to local
disk as Arrow IPC; the runs are then merged a slice at a time (`_merge`). Memory is about
`file_rows` rows plus the scanner's read-ahead, whatever the window's size; local disk holds the
window once, uncompressed, while it is merged. An in-memory sort of the whole window (Acero's
order_by, DataFusion without a memory limit) would need the window in memory, and DuckDB is not
a dependency.

Errors name the table and the cause. A missing table, a version whose data files are gone (a
vacuum while the export read it, or files deleted by hand), a window without rows and a column
the table lacks are not retried: another try reads the same table. A storage outage is
(`SourceUnavailable`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_trainpipe.sources.sql import (
    ExportedFile,
    ParquetExport,
    SourceError,
    SourceUnavailable,
    SqlWindow,
)
from airflow_trainpipe.storage import is_local, local_path, resolve

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from airflow_trainpipe.config.sources import DeltaSource

# delta-rs colours its error chains for a terminal.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# Storage refusals that another try would only repeat.
_REFUSED = (
    "403",
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
    refused = isinstance(exc, PermissionError) or any(word in text.lower() for word in _REFUSED)
    if isinstance(exc, OSError) and not refused:
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

    from airflow_trainpipe.sources.sql import airflow_connection

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


def _first_day_from(moment: datetime) -> Any:
    """The first date whose midnight is at or after `moment` (a date compares as its midnight)."""
    day = moment.date()
    return day if moment.time() == datetime.min.time() else day + timedelta(days=1)


def _iso_text(moment: datetime, whole_days: bool) -> str:
    return moment.date().isoformat() if whole_days else moment.strftime("%Y-%m-%dT%H:%M:%S")


def window_filter(field: pa.Field, window: SqlWindow, table: str) -> pc.Expression:
    """`window.start <= field < window.end`, with bounds of the field's own type (see
    `DeltaSource.time_column`): compared in Arrow, so a partition column prunes whole files."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind, start, end = field.type, window.start, window.end
    bounds: tuple[Any, Any]
    if pa.types.is_timestamp(kind):
        # An instant; a timestamp without a time zone (Delta's timestamp_ntz) is read as UTC.
        bounds = (start, end) if kind.tz else (start.replace(tzinfo=None), end.replace(tzinfo=None))
    elif pa.types.is_date(kind):
        bounds = (_first_day_from(start), _first_day_from(end))
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        whole = start.time() == end.time() == datetime.min.time()
        bounds = (_iso_text(start, whole), _iso_text(end, whole))
    else:
        raise SourceError(
            f"data.source.time_column {field.name!r} of {table} is {kind}; expected a timestamp, "
            "date or string column"
        )
    column = pc.field(field.name)
    return (column >= pa.scalar(bounds[0], type=kind)) & (column < pa.scalar(bounds[1], type=kind))


def open_table(source: DeltaSource) -> Any:
    """The table at its current version (a `deltalake.DeltaTable`)."""
    from deltalake import DeltaTable

    table = resolve(source.uri)
    options = storage_options(table, source.conn_id)
    try:
        return DeltaTable(_location(table), storage_options=options)
    except Exception as exc:
        raise _classified(exc, table, "opening") from exc


def window_scan(source: DeltaSource, window: SqlWindow) -> WindowScan:
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


def count_rows(source: DeltaSource, window: SqlWindow) -> tuple[int, WindowScan]:
    """Rows of the window at the current version: a file the log's statistics place wholly inside
    the window is counted from its Parquet footer, the others stream the time column only."""
    scan = window_scan(source, window)
    try:
        return scan.dataset.count_rows(filter=scan.filter, batch_size=source.batch_rows), scan
    except Exception as exc:
        raise _classified(
            exc, scan.table, f"counting the window's rows of version {scan.version} of"
        ) from exc


def rows_ready(source: DeltaSource, window: SqlWindow, min_rows: int) -> tuple[bool, str]:
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


def export(source: DeltaSource, window: SqlWindow, folder: Path) -> DeltaExport:
    """The window's rows, ordered by `order_by`, written as Parquet files into `folder` (not yet
    frozen); `folder/sort` holds the sort's spilled runs meanwhile."""
    scan = window_scan(source, window)
    return export_scan(source, scan, folder)


def export_scan(source: DeltaSource, scan: WindowScan, folder: Path) -> DeltaExport:
    import pyarrow as pa

    out = ParquetExport(source, folder)
    spill = folder / "sort"
    spill.mkdir()
    schema = pa.schema([scan.dataset.schema.field(name) for name in scan.columns])
    try:
        for batch in sorted_batches(scan_batches(scan, source.batch_rows), schema, source, spill):
            out.add(batch)
    except pa.ArrowNotImplementedError as exc:  # a key type Arrow cannot sort (a list, a struct)
        raise SourceError(
            f"sorting the window of {scan.table} by data.source.order_by: {_text(exc)}"
        ) from exc
    files = out.finish()
    if not files or out.schema is None:
        raise SourceError(
            f"{scan.table} (version {scan.version}) has no rows in the run's window ({scan.filter_text})"
        )
    return DeltaExport(files=files, schema=out.schema, scan=scan)


# --- external sort ----------------------------------------------------------------------------


def _sort_options(keys: list[str]) -> dict[str, Any]:
    # Nulls last: Arrow's default, left implicit (pyarrow 25 deprecates the global option).
    return {"sort_keys": [(key, "ascending") for key in keys]}


def _sorted(table: pa.Table, keys: list[str]) -> pa.Table:
    import pyarrow.compute as pc

    return table.take(pc.sort_indices(table, **_sort_options(keys)))


def sorted_batches(
    batches: Iterable[pa.RecordBatch], schema: pa.Schema, source: DeltaSource, spill: Path
) -> Iterator[pa.RecordBatch]:
    """`batches` ordered by `source.order_by`: sorted in memory when they fit in `file_rows` rows,
    else sorted `file_rows` at a time into runs spilled under `spill` and merged. Every comparison
    is Arrow's own sort, so the runs and the merge agree on the order (nulls last)."""
    import pyarrow as pa

    keys, limit = source.order_by, source.file_rows
    runs: list[Path] = []
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        pending.append(batch)
        rows += batch.num_rows
        if rows >= limit:
            runs.append(_spill(_sorted(pa.Table.from_batches(pending, schema), keys), spill, len(runs)))
            pending, rows = [], 0
    if not runs:
        yield from _sorted(pa.Table.from_batches(pending, schema), keys).to_batches()
        return
    if rows:
        runs.append(_spill(_sorted(pa.Table.from_batches(pending, schema), keys), spill, len(runs)))
    del pending
    readers = [_Run(path, schema) for path in runs]
    try:  # the buffers together hold about `file_rows` rows
        yield from _merge(readers, keys, max(1, limit // len(readers)))
    finally:
        for reader in readers:
            reader.close()


def _spill(table: pa.Table, folder: Path, index: int) -> Path:
    import pyarrow as pa

    path = folder / f"run-{index:05d}.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=65_536)
    return path


class _Run:
    """A sorted run on disk, memory-mapped (uncompressed IPC: batches are read without a copy),
    taken into `buffer` a slice at a time."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        import pyarrow as pa

        self._file = pa.memory_map(str(path))
        self._reader = pa.ipc.open_file(self._file)
        self._batch: pa.RecordBatch | None = None
        self._offset = self._next = 0
        self.schema = schema
        self.buffer = schema.empty_table()

    @property
    def on_disk(self) -> bool:
        """Whether rows remain beyond the buffer."""
        in_batch = self._batch is not None and self._offset < self._batch.num_rows
        return in_batch or self._next < self._reader.num_record_batches

    def refill(self, rows: int) -> None:
        """Read on until the buffer holds `rows` rows (or the run ends)."""
        import pyarrow as pa

        parts, held = self.buffer.to_batches(), self.buffer.num_rows
        while held < rows and self.on_disk:
            if self._batch is None or self._offset == self._batch.num_rows:
                self._batch, self._offset = self._reader.get_batch(self._next), 0
                self._next += 1
            part = self._batch.slice(self._offset, rows - held)
            parts.append(part)
            self._offset += part.num_rows
            held += part.num_rows
        self.buffer = pa.Table.from_batches(parts, self.schema)

    def close(self) -> None:
        self._file.close()


def _merge(runs: list[_Run], keys: list[str], share: int) -> Iterator[pa.RecordBatch]:
    """K-way merge of sorted runs, a slice at a time. Each round the bound is the smallest of the
    last buffered keys of the runs with rows left on disk: no unread row sorts below it, so every
    buffered row at or below it is final. Those rows (a prefix of each buffer) are sorted together
    and emitted; the run that set the bound is emptied and refilled. Ties are left for
    `ParquetExport` to refuse: equal rows come out next to each other."""
    import pyarrow as pa

    for run in runs:
        run.refill(share)
    while held := [run for run in runs if run.buffer.num_rows]:
        waiting = [run for run in held if run.on_disk]
        if waiting:
            bound = _sorted(_ends(waiting, keys, last=True), keys).slice(0, 1)
            counts = _counts(held, bound, keys)
        else:
            counts = [run.buffer.num_rows for run in held]
        taken = []
        for run, count in zip(held, counts, strict=True):
            if count:
                taken.append(run.buffer.slice(0, count))
                run.buffer = run.buffer.slice(count)
        yield from _sorted(pa.concat_tables(taken), keys).to_batches()
        for run in waiting:
            if not run.buffer.num_rows:
                run.refill(share)


def _ends(runs: list[_Run], keys: list[str], last: bool) -> pa.Table:
    """The first (or last) buffered key of each run, one row per run."""
    import pyarrow as pa

    return pa.concat_tables(
        [run.buffer.select(keys).slice(run.buffer.num_rows - 1 if last else 0, 1) for run in runs]
    )


def _counts(runs: list[_Run], bound: pa.Table, keys: list[str]) -> list[int]:
    """How many rows of each run's sorted buffer sort at or before `bound` (a prefix): the ends
    of all buffers are placed at once, a whole buffer only when the bound falls inside it."""
    starts = _at_or_before(_ends(runs, keys, last=False), bound, keys)
    ends = _at_or_before(_ends(runs, keys, last=True), bound, keys)
    counts = []
    for i, run in enumerate(runs):
        if i in ends:
            counts.append(run.buffer.num_rows)
        else:
            counts.append(len(_at_or_before(run.buffer, bound, keys)) if i in starts else 0)
    return counts


def _at_or_before(rows: pa.Table, bound: pa.Table, keys: list[str]) -> set[int]:
    """Indices of `rows` that sort at or before `bound`: those ahead of it when it is sorted among
    them with a marker column that puts it after its equals. Arrow's sort decides, never Python's
    comparisons, so the order is the one the runs were sorted in, for every type."""
    import pyarrow as pa
    import pyarrow.compute as pc

    marker = "bound"
    while marker in keys:
        marker += "_"
    probe = pa.concat_tables([rows.select(keys), bound]).append_column(
        marker,
        pa.concat_arrays([pa.repeat(pa.scalar(0, pa.int8()), rows.num_rows), pa.array([1], pa.int8())]),
    )
    order = pc.sort_indices(probe, **_sort_options([*keys, marker]))
    return set(order.slice(0, pc.index(order, rows.num_rows).as_py()).to_pylist())
