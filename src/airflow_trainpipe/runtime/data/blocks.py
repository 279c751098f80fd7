"""A snapshot as blocks: the unit every rank reads, shuffles and scores by.

A block is one Parquet row group (a CSV file is one block: Arrow parses it whole). Blocks are
numbered in the snapshot's file order and know where their first row sits in it, so the holdout
split of a block is the one the whole-snapshot split gives those rows, whichever rank reads it.

The fit stage reads every file once with its bytes checked against the validated manifest and
records each file's identity (size and modification stamp). A rank reading a block later checks
that identity again: a stat, not a re-hash of the file, which is what lets each rank read only
its blocks. Rewriting a file in place with the same size within the same modification stamp
would pass; every store we support changes the stamp (an S3 ETag changes with every PUT).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_trainpipe.config.data import DataSection, ValidationSplit
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.core.storage import filesystem
from airflow_trainpipe.runtime.data.reader import (
    ChangedDataError,
    DataError,
    HoldoutSplit,
    require_columns,
    verified_bytes,
)

IDENTITY_KEYS = ("ETag", "etag", "LastModified", "mtime", "last_modified", "updated")


@dataclass(frozen=True)
class Block:
    file: int
    """Index into the run's data files."""

    row_group: int | None
    """Parquet row group; None for a CSV file (one block)."""

    first_row: int
    """Position of the block's first row in the snapshot (its files in order)."""

    train_rows: int
    holdout_rows: int
    validation_rows: int = 0
    """A tuning trial's validation rows (carved out of the training rows)."""

    @property
    def rows(self) -> int:
        return self.train_rows + self.holdout_rows + self.validation_rows

    def to_list(self) -> list[int | None]:
        return [
            self.file, self.row_group, self.first_row, self.train_rows, self.holdout_rows, self.validation_rows,
        ]  # fmt: skip

    @classmethod
    def from_list(cls, values: list[int | None]) -> Block:
        file, row_group, first_row, train_rows, holdout_rows, *validation = values
        assert file is not None and first_row is not None and train_rows is not None
        assert holdout_rows is not None
        return cls(
            file, row_group, first_row, train_rows, holdout_rows, int(validation[0] or 0) if validation else 0
        )


def file_identity(uri: str, fmt: str) -> str:
    """Size and modification stamp of a file, as the store reports them."""
    fs, path = filesystem(uri)
    try:
        info = fs.info(path)
    except OSError as exc:
        raise DataError(f"cannot read {uri} as {fmt}: {exc}") from exc
    stamp = next((str(info[k]) for k in IDENTITY_KEYS if info.get(k) is not None), "")
    return f"{info.get('size')}:{stamp}"


def _parse(uri: str, fmt: str, handle: object, columns: list[str]) -> Iterator[tuple[int | None, pa.Table]]:
    if fmt == "parquet":
        parquet = pq.ParquetFile(handle)
        require_columns(uri, parquet.schema_arrow.names, columns)
        for group in range(parquet.num_row_groups):
            yield group, parquet.read_row_group(group, columns=columns).select(columns)
        return
    table = pacsv.read_csv(handle)
    require_columns(uri, table.column_names, columns)
    yield None, table.select(columns)


def scan_blocks(
    files: list[str], fmt: str, columns: list[str], manifest: Manifest | None
) -> Iterator[tuple[int, int | None, pa.Table]]:
    """Every block of `files` in order, as (file index, row group, rows); with the manifest, each
    file's bytes are checked as they are read, and parsed from those very bytes."""
    expected = {f.uri: f for f in manifest.files} if manifest is not None else {}
    for index, uri in enumerate(files):
        try:
            if uri in expected:
                assert manifest is not None
                source: object = pa.BufferReader(verified_bytes(uri, expected[uri], manifest.digest))
            else:
                fs, path = filesystem(uri)
                source = fs.open(path, "rb")
            with source:  # type: ignore[attr-defined]
                for group, table in _parse(uri, fmt, source, columns):
                    yield index, group, table
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"cannot read {uri} as {fmt}: {exc}") from exc


class BlockReader:
    """Reads single blocks of the files the fit stage saw, refusing any file changed since."""

    def __init__(
        self,
        files: list[str],
        identities: list[str],
        data: DataSection,
        columns: list[str],
        validation: ValidationSplit | None = None,
    ):
        self.files, self.identities, self.data, self.columns = files, identities, data, columns
        self.split = HoldoutSplit(data, validation)

    def read(self, block: Block) -> pa.Table:
        uri = self.files[block.file]
        now = file_identity(uri, self.data.format)
        if now != self.identities[block.file]:
            raise ChangedDataError(
                f"{uri} changed since the fit stage read it (size:stamp {self.identities[block.file]} -> "
                f"{now}); nothing more is trained on it (re-run validate_data to validate the new bytes)"
            )
        fs, path = filesystem(uri)
        try:
            with fs.open(path, "rb") as handle:
                if block.row_group is None:
                    return next(_parse(uri, self.data.format, handle, self.columns))[1]
                parquet = pq.ParquetFile(handle)
                return parquet.read_row_group(block.row_group, columns=self.columns).select(self.columns)
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"cannot read block {block.row_group} of {uri}: {exc}") from exc

    def parts(self, block: Block) -> tuple[pa.Table, pa.Table]:
        """(training rows, holdout rows) of one block."""
        table = self.read(block)
        holdout, validation = self.sides(block, table)
        return table.filter(pa.array(~holdout & ~validation)), table.filter(pa.array(holdout))

    def sides(self, block: Block, table: pa.Table) -> tuple[Any, Any]:
        """(holdout, validation) masks of a block's rows as read; the rest trains."""
        return self.split.sides_at(table, block.first_row)
