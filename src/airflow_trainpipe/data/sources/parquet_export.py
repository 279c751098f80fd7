"""An ordered stream of Arrow batches cut into Parquet files of fixed shape, the export every
exported source kind shares (`sql` directly; `delta` and `iceberg` through `sorted_export`).

Bytes are a function of the rows alone: row groups are cut at exactly `batch_rows` rows (not at
the driver's or the scanner's batch boundaries) and files at `file_rows`, so the same rows always
give the same files and digest. A tie in the ordering key would let the reader order those rows
either way: the export fails naming it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.data.sources.errors import SourceError

if TYPE_CHECKING:
    import pyarrow as pa

    from airflow_trainpipe.config.sources import SqlSource, TableSource


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
