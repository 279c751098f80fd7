from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.runtime.data import (
    DataError,
    HoldoutSplit,
    fit_transform,
    holdout_mask,
    load_dataset,
    read_table,
)
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


def test_holdout_rows_never_influence_the_fitted_transform(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2)
    before = fit_transform(files, CONFIG.data, CONFIG.features, "binary_classification")
    # Make every holdout row extreme: a leak would move the fitted mean, quantiles and vocabulary.
    path = Path(files[0].removeprefix("file://"))
    table = pq.read_table(path)
    mask = holdout_mask(table, CONFIG.data)
    for name, extreme in (
        ("amount", 1e9),
        ("distance_from_home_km", -5.0),
        ("account_age_days", 10**7),
        ("country", "ZZ"),
        ("channel", "fax"),
    ):
        column = table.column(name).to_numpy(zero_copy_only=False)
        table = table.set_column(
            table.column_names.index(name), name, pa.array(np.where(mask, extreme, column))
        )
    pq.write_table(table, path)
    after = fit_transform(files, CONFIG.data, CONFIG.features, "binary_classification")
    assert after.to_json() == before.to_json() and after.hash == before.hash
    # ...while a training row does move them: the test can fail.
    first_train = int(np.flatnonzero(~mask)[0])
    amount = table.column("amount").to_numpy().copy()
    amount[first_train] = 1e9
    pq.write_table(table.set_column(table.column_names.index("amount"), "amount", pa.array(amount)), path)
    assert fit_transform(files, CONFIG.data, CONFIG.features, "binary_classification").hash != before.hash


def test_the_row_split_does_not_depend_on_batching() -> None:
    data = CONFIG.data.model_copy(
        update={"holdout": CONFIG.data.holdout.model_copy(update={"key_column": None})}
    )
    table = transactions(date(2026, 1, 1), 150_000, seed=1)
    whole = HoldoutSplit(data).mask(table)
    split = HoldoutSplit(data)
    pieces = np.concatenate(
        [split.mask(table.slice(start, 7_777)) for start in range(0, table.num_rows, 7_777)]
    )
    assert np.array_equal(whole, pieces) and 0.18 < whole.mean() < 0.22


def test_dataset_is_encoded_by_its_fitted_transform(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2)
    dataset = load_dataset(files, CONFIG.data, CONFIG.features, "binary_classification")
    transform = dataset.transform
    assert (
        dataset.train_x.shape[1]
        == dataset.holdout_x.shape[1]
        == transform.num_dense + len(transform.cardinalities)
    )
    assert np.array_equal(dataset.holdout_x, transform.features(dataset.holdout_table))
    assert len(dataset.train_y) + dataset.holdout_table.num_rows == 1500


def test_missing_column_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 10, seed=1).drop(["amount"]), path)
    with pytest.raises(DataError, match=f"{path.as_uri()} lacks column\\(s\\) amount"):
        read_table([path.as_uri()], "parquet", ["amount", "hour"])


def test_null_labels_are_refused_with_the_column_named(tmp_path: Path) -> None:
    table = transactions(date(2026, 1, 1), 50, seed=1)
    labels = pa.array([None, *table.column("is_fraud").to_pylist()[1:]], pa.int64())
    path = tmp_path / "part.parquet"
    pq.write_table(table.set_column(table.column_names.index("is_fraud"), "is_fraud", labels), path)
    with pytest.raises(DataError, match="label column 'is_fraud' has 1 null value"):
        load_dataset([path.as_uri()], CONFIG.data, CONFIG.features, "binary_classification")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_labels_are_refused_with_the_column_named(tmp_path: Path, bad: float) -> None:
    table = transactions(date(2026, 1, 1), 50, seed=1)
    labels = pa.array([bad, *map(float, table.column("is_fraud").to_pylist()[1:])], pa.float64())
    path = tmp_path / "part.parquet"
    pq.write_table(table.set_column(table.column_names.index("is_fraud"), "is_fraud", labels), path)
    with pytest.raises(DataError, match="label column 'is_fraud' has 1 NaN or infinite value"):
        load_dataset([path.as_uri()], CONFIG.data, CONFIG.features, "binary_classification")


def test_a_snapshot_too_small_to_split_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 1, seed=1), path)
    with pytest.raises(
        DataError,
        match=r"holdout split left 1 training and 0 holdout rows|holdout split left 0 training and 1 holdout rows",
    ):
        load_dataset([path.as_uri()], CONFIG.data, CONFIG.features, "binary_classification")


def test_every_holdout_seed_gives_its_own_key_split() -> None:
    table = transactions(date(2026, 1, 1), 2000, seed=1)
    masks = {}
    for seed in (0, 1, 2, 9, 10, 11, 12345678, 123456789):
        data = CONFIG.data.model_copy(
            update={"holdout": CONFIG.data.holdout.model_copy(update={"seed": seed})}
        )
        masks[seed] = holdout_mask(table, data).tobytes()
    assert len(set(masks.values())) == len(masks)


def test_a_file_overwritten_since_validation_is_refused_by_name(tmp_path: Path) -> None:
    from airflow_trainpipe.runtime.data import ChangedDataError
    from airflow_trainpipe.snapshot import resolve_snapshot

    data = CONFIG.data.model_copy(update={"uri": tmp_path.as_uri()})
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2, files=2)
    manifest = resolve_snapshot(data, "ds=2026-01-01")
    verified = load_dataset(files, data, CONFIG.features, "binary_classification", manifest)
    plain = load_dataset(files, data, CONFIG.features, "binary_classification")
    assert np.array_equal(verified.train_x, plain.train_x) and verified.transform.hash == plain.transform.hash
    # Overwritten in place with other rows of the same schema, as a re-run export would.
    path = Path(files[1].removeprefix("file://"))
    pq.write_table(transactions(date(2026, 1, 1), 700, seed=3), path)
    with pytest.raises(
        ChangedDataError,
        match=f"{files[1]} changed since it was validated: .* the snapshot {manifest.digest}",
    ):
        load_dataset(files, data, CONFIG.features, "binary_classification", manifest)
