"""Read a snapshot's files, split off the holdout, and encode rows as model inputs.

The split and the encoding are pure functions of the files and the config, so every rank,
every retry and the champion's evaluation see exactly the same rows and numbers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.exceptions import TrainpipeError
from airflow_trainpipe.storage import filesystem


class DataError(TrainpipeError):
    """The snapshot cannot be trained on (missing columns, unreadable file, too few rows)."""


def read_table(files: list[str], fmt: str, columns: list[str]) -> pa.Table:
    """Exactly `files`, in order, reduced to `columns`."""
    tables = []
    for uri in files:
        fs, path = filesystem(uri)
        try:
            with fs.open(path, "rb") as handle:
                table = pq.read_table(handle) if fmt == "parquet" else pacsv.read_csv(handle)
        except (OSError, pa.ArrowInvalid) as exc:
            raise DataError(f"cannot read {uri} as {fmt}: {exc}") from exc
        missing = [c for c in columns if c not in table.column_names]
        if missing:
            raise DataError(f"{uri} lacks column(s) {', '.join(missing)}")
        tables.append(table.select(columns))
    return pa.concat_tables(tables, promote_options="permissive") if len(tables) > 1 else tables[0]


def holdout_mask(table: pa.Table, data: DataSection) -> np.ndarray:
    """True for holdout rows: by a stable hash of `key_column`, or a seeded draw per row."""
    n = table.num_rows
    threshold = int(data.holdout.fraction * 10_000)
    if data.holdout.key_column:
        import pandas as pd

        keys = table.column(data.holdout.key_column).to_pandas().astype(str)
        hashed = pd.util.hash_pandas_object(keys, index=False, hash_key=f"trainpipe{data.holdout.seed:08d}"[:16])
        return (hashed.to_numpy() % 10_000) < threshold
    rng = np.random.default_rng(data.holdout.seed)
    return rng.integers(0, 10_000, size=n) < threshold


@dataclass
class TabularEncoder:
    """Standardises numeric features and indexes categorical ones; fitted on training rows only.

    Index 0 of every categorical vocabulary is 'unknown or missing', so unseen values at
    evaluation or serving time map to it instead of failing.
    """

    numeric: list[str]
    categorical: list[str]
    means: list[float]
    stds: list[float]
    vocabularies: list[list[str]]
    label_mean: float = 0.0
    label_std: float = 1.0

    @classmethod
    def fit(cls, table: pa.Table, data: DataSection, task: str) -> TabularEncoder:
        means, stds = [], []
        for name in data.features.numeric:
            values = _numeric(table, name)
            finite = values[np.isfinite(values)]
            mean = float(finite.mean()) if finite.size else 0.0
            std = float(finite.std()) if finite.size else 1.0
            means.append(mean)
            stds.append(std if std > 1e-12 else 1.0)
        vocabularies = []
        for name in data.features.categorical:
            values = table.column(name).cast(pa.string()).drop_null().unique().to_pylist()
            vocabularies.append(sorted(values))
        label_mean, label_std = 0.0, 1.0
        if task == "regression":
            label = _numeric(table, data.label)
            label_mean, label_std = float(label.mean()), float(label.std()) or 1.0
        return cls(list(data.features.numeric), list(data.features.categorical), means, stds, vocabularies, label_mean, label_std)

    @property
    def cardinalities(self) -> list[int]:
        return [len(v) + 1 for v in self.vocabularies]

    def features(self, table: pa.Table) -> np.ndarray:
        """float32 matrix: standardised numeric columns, then categorical codes (as floats)."""
        columns = []
        for name, mean, std in zip(self.numeric, self.means, self.stds, strict=True):
            values = (_numeric(table, name) - mean) / std
            columns.append(np.where(np.isfinite(values), values, 0.0))
        for name, vocabulary in zip(self.categorical, self.vocabularies, strict=True):
            # Vectorised lookup; a value outside the vocabulary (or null) becomes index 0.
            position = pc.index_in(table.column(name).cast(pa.string()), value_set=pa.array(vocabulary, pa.string()))
            columns.append(pc.fill_null(position, -1).to_numpy(zero_copy_only=False).astype(np.float64) + 1)
        return np.stack(columns, axis=1).astype(np.float32) if columns else np.zeros((table.num_rows, 0), np.float32)

    def labels(self, table: pa.Table, label: str) -> np.ndarray:
        return ((_numeric(table, label) - self.label_mean) / self.label_std).astype(np.float32)

    def to_json(self) -> str:
        return json.dumps(self.__dict__, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> TabularEncoder:
        return cls(**json.loads(text))


def _numeric(table: pa.Table, name: str) -> np.ndarray:
    column = table.column(name)
    try:
        return column.cast(pa.float64()).to_numpy(zero_copy_only=False).astype(np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(f"column {name!r} is not numeric ({column.type})") from exc


@dataclass
class Dataset:
    encoder: TabularEncoder
    train_x: np.ndarray
    train_y: np.ndarray
    holdout_x: np.ndarray
    holdout_y: np.ndarray
    holdout_table: pa.Table | None = None
    """The raw holdout rows: the final evaluation encodes them again with the champion's encoder."""


def load_dataset(files: list[str], data: DataSection, task: str) -> Dataset:
    columns = list(dict.fromkeys([*data.features.all, data.label, *([data.holdout.key_column] if data.holdout.key_column else [])]))
    table = read_table(files, data.format, columns)
    if table.column(data.label).null_count:
        raise DataError(f"label column {data.label!r} has {table.column(data.label).null_count} null value(s)")
    mask = holdout_mask(table, data)
    train, holdout = table.filter(pa.array(~mask)), table.filter(pa.array(mask))
    if train.num_rows == 0 or holdout.num_rows == 0:
        raise DataError(f"holdout split left {train.num_rows} training and {holdout.num_rows} holdout rows")
    encoder = TabularEncoder.fit(train, data, task)  # training rows only: no holdout leakage
    return Dataset(
        encoder,
        encoder.features(train),
        encoder.labels(train, data.label),
        encoder.features(holdout),
        encoder.labels(holdout, data.label),
        holdout,
    )
