from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.runtime.data import DataError, TabularEncoder, holdout_mask, load_dataset, read_table
from airflow_trainpipe.synthetic import transactions, write_day
from tests.conftest import EXAMPLE_CONFIGS

CONFIG = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")


def test_holdout_split_is_stable_per_key() -> None:
    table = transactions(date(2026, 1, 1), 2000, seed=1)
    mask = holdout_mask(table, CONFIG.data)
    assert 0.15 < mask.mean() < 0.25
    # The same key lands on the same side whatever else is in the snapshot.
    half = table.slice(0, 1000)
    assert np.array_equal(holdout_mask(half, CONFIG.data), mask[:1000])


def test_encoder_statistics_ignore_holdout_rows(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2)
    before = load_dataset(files, CONFIG.data, "binary_classification").encoder
    # Make every holdout row extreme: a leak would move the fitted mean and vocabulary.
    table = pq.read_table(Path(files[0].removeprefix("file://")))
    mask = holdout_mask(table, CONFIG.data)
    amount = np.where(mask, 1e9, table.column("amount").to_numpy())
    country = np.where(mask, "ZZ", table.column("country").to_numpy(zero_copy_only=False))
    table = table.set_column(table.column_names.index("amount"), "amount", pa.array(amount))
    table = table.set_column(table.column_names.index("country"), "country", pa.array(country))
    pq.write_table(table, Path(files[0].removeprefix("file://")))
    after = load_dataset(files, CONFIG.data, "binary_classification").encoder
    assert after == before


def test_encoder_maps_unknown_categories_and_missing_numbers_safely() -> None:
    table = transactions(date(2026, 1, 1), 200, seed=1)
    encoder = TabularEncoder.fit(table, CONFIG.data, "binary_classification")
    rows = pa.table({
        **{name: pa.array([None], pa.float64()) for name in encoder.numeric},
        **{name: pa.array(["never-seen"]) for name in encoder.categorical},
    })
    features = encoder.features(rows)
    assert np.all(features == 0.0)  # mean-imputed (0 after standardising) and the unknown index
    assert TabularEncoder.from_json(encoder.to_json()) == encoder


def test_missing_column_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 10, seed=1).drop(["amount"]), path)
    with pytest.raises(DataError, match=f"{path.as_uri()} lacks column\\(s\\) amount"):
        read_table([path.as_uri()], "parquet", ["amount", "hour"])


def test_null_labels_are_refused_with_the_column_named(tmp_path: Path) -> None:
    table = transactions(date(2026, 1, 1), 50, seed=1)
    labels = pa.array([None] + table.column("is_fraud").to_pylist()[1:], pa.int64())
    path = tmp_path / "part.parquet"
    pq.write_table(table.set_column(table.column_names.index("is_fraud"), "is_fraud", labels), path)
    with pytest.raises(DataError, match="label column 'is_fraud' has 1 null value"):
        load_dataset([path.as_uri()], CONFIG.data, "binary_classification")


def test_a_snapshot_too_small_to_split_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 1, seed=1), path)
    with pytest.raises(DataError, match="holdout split left 1 training and 0 holdout rows|holdout split left 0 training and 1 holdout rows"):
        load_dataset([path.as_uri()], CONFIG.data, "binary_classification")
