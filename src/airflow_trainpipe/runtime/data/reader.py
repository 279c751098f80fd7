"""Read a snapshot's files in batches, check what was validated, and split off the holdout.

The split is a pure function of the rows' positions (or keys) and the config, so every rank,
every retry and the champion's evaluation see exactly the same training and holdout rows. The
fit stage (runtime.prepare) and the ranks' streams (runtime.stream) build on these.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_trainpipe.config.data import DataSection, ValidationSplit
from airflow_trainpipe.contracts.formats import split_key
from airflow_trainpipe.contracts.manifest import Manifest, SnapshotFile
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.core.storage import filesystem

BATCH_ROWS = 1 << 16
SPLIT_BLOCK = 1 << 16  # rows per seeded draw block of the row-wise split


class DataError(TrainpipeError):
    """The snapshot cannot be trained on (missing columns, unreadable file, too few rows)."""


class ChangedDataError(DataError):
    """A file's bytes are not the ones validation saw: the run must not train on it."""


def iter_batches(
    files: list[str],
    fmt: str,
    columns: list[str],
    batch_rows: int = BATCH_ROWS,
    manifest: Manifest | None = None,
) -> Iterator[pa.Table]:
    """Exactly `files`, in order, reduced to `columns`, as tables of at most `batch_rows` rows.

    With the validated `manifest`, each file is read whole, hashed as it is read, and parsed
    from those very bytes, so what trains is what was validated: a file overwritten since
    (in place or replaced) raises ChangedDataError naming it. Memory is bounded by the largest
    file (a CSV is read whole anyway: type inference needs all of it), not by the snapshot.
    """
    expected = {f.uri: f for f in manifest.files} if manifest is not None else {}
    digest = manifest.digest if manifest is not None else ""
    for uri in files:
        try:
            source = verified_bytes(uri, expected[uri], digest) if uri in expected else None
            fs, path = filesystem(uri)
            with pa.BufferReader(source) if source is not None else fs.open(path, "rb") as handle:
                if fmt == "parquet":
                    parquet = pq.ParquetFile(handle)
                    require_columns(uri, parquet.schema_arrow.names, columns)
                    for batch in parquet.iter_batches(batch_size=batch_rows, columns=columns):
                        yield pa.Table.from_batches([batch]).select(columns)
                    continue
                table = pacsv.read_csv(handle)
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"cannot read {uri} as {fmt}: {exc}") from exc
        require_columns(uri, table.column_names, columns)
        for batch in table.select(columns).to_batches(max_chunksize=batch_rows):
            yield pa.Table.from_batches([batch])


def verified_bytes(uri: str, expected: SnapshotFile, digest: str) -> bytearray:
    fs, path = filesystem(uri)
    content, sha = bytearray(), hashlib.sha256()
    with fs.open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            sha.update(chunk)
            content += chunk
    if sha.hexdigest() != expected.sha256 or len(content) != expected.size:
        raise ChangedDataError(
            f"{uri} changed since it was validated: {len(content)} bytes with sha256 {sha.hexdigest()[:16]}..., "
            f"the snapshot {digest} recorded {expected.size} bytes with sha256 {expected.sha256[:16]}...; "
            "nothing is trained on it (re-run validate_data to validate the new bytes)"
        )
    return content


def check_label(table: pa.Table, label: str) -> None:
    """Labels every row can train on: no nulls, no NaN or infinities."""
    column = table.column(label)
    if column.null_count:
        raise DataError(f"label column {label!r} has {column.null_count} null value(s)")
    if pa.types.is_floating(column.type):
        import pyarrow.compute as pc

        # NaN is not null to Arrow, and would reach the label statistics and the loss.
        bad = pc.sum(pc.invert(pc.is_finite(column))).as_py() or 0
        if bad:
            raise DataError(f"label column {label!r} has {bad} NaN or infinite value(s)")


def require_columns(uri: str, present: list[str], columns: list[str]) -> None:
    missing = [c for c in columns if c not in present]
    if missing:
        raise DataError(f"{uri} lacks column(s) {', '.join(missing)}")


def read_table(files: list[str], fmt: str, columns: list[str]) -> pa.Table:
    """Exactly `files`, in order, reduced to `columns`."""
    tables = list(iter_batches(files, fmt, columns))
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


class HoldoutSplit:
    """True for holdout rows: by a stable hash of the split key (`holdout.key_column`, or a ranking
    task's group: its rows all on one side), or a seeded draw per row position.

    Row-wise draws come in fixed blocks seeded by (seed, block number), so the mask of a row
    depends on its position only, never on how the files were batched.

    With a `validation` split (a tuning trial), a second, independent draw carves the trial's
    validation rows out of the training rows; the holdout stays exactly the gate's holdout.
    """

    def __init__(self, data: DataSection, validation: ValidationSplit | None = None):
        self.data = data
        self.validation = validation
        self.threshold = int(data.holdout.fraction * 10_000)
        self.offset = 0
        self._hash_key = split_key("holdout", data.holdout.seed)  # contracts/formats.py: stored bytes
        self._validation_key = split_key("validation", validation.seed) if validation else ""

    def mask(self, table: pa.Table) -> np.ndarray:
        """The mask of the next rows: `table` follows the rows of the previous call."""
        start = self.offset
        self.offset += table.num_rows
        return self.mask_at(table, start)

    def mask_at(self, table: pa.Table, start: int) -> np.ndarray:
        """The mask of `table`, whose first row is row `start` of the snapshot."""
        return self._draws(table, start, self._hash_key, [self.data.holdout.seed]) < self.threshold

    def sides_at(self, table: pa.Table, start: int) -> tuple[np.ndarray, np.ndarray]:
        """(holdout, validation) masks of `table`: the trial's validation rows are never holdout
        rows; without a validation split, none."""
        holdout = self.mask_at(table, start)
        if self.validation is None:
            return holdout, np.zeros(table.num_rows, bool)
        # A third seed element: a stream independent of the holdout's draws of the same block.
        draws = self._draws(table, start, self._validation_key, [self.validation.seed, 1])
        return holdout, (draws < int(self.validation.fraction * 10_000)) & ~holdout

    def _draws(self, table: pa.Table, start: int, hash_key: str, seed: list[int]) -> np.ndarray:
        """A number in [0, 10000) per row: of its key's hash, or of a seeded draw at its position."""
        n = table.num_rows
        if self.data.split_key:
            import pandas as pd

            keys = table.column(self.data.split_key).to_pandas().astype(str)
            hashed = pd.util.hash_pandas_object(keys, index=False, hash_key=hash_key)
            return hashed.to_numpy() % 10_000
        draws = (
            [
                np.random.default_rng([seed[0], block, *seed[1:]]).integers(0, 10_000, size=SPLIT_BLOCK)
                for block in range(start // SPLIT_BLOCK, (start + n - 1) // SPLIT_BLOCK + 1)
            ]
            if n
            else [np.zeros(0, np.int64)]
        )
        first = start - (start // SPLIT_BLOCK) * SPLIT_BLOCK
        return np.concatenate(draws)[first : first + n]


def holdout_mask(table: pa.Table, data: DataSection) -> np.ndarray:
    return HoldoutSplit(data).mask(table)


def data_columns(data: DataSection) -> list[str]:
    return list(
        dict.fromkeys([*data.features.all, data.label, *filter(None, [data.holdout.key_column, data.group])])
    )
