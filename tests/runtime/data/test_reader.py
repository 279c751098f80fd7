from __future__ import annotations

from datetime import date
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.examples.synthetic import transactions
from airflow_trainpipe.runtime.data.reader import DataError, HoldoutSplit, holdout_mask, read_table
from tests.conftest import EXAMPLE_CONFIGS

CONFIG = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")


def test_holdout_split_is_stable_per_key() -> None:
    table = transactions(date(2026, 1, 1), 2000, seed=1)
    mask = holdout_mask(table, CONFIG.data)
    assert 0.15 < mask.mean() < 0.25
    # The same key lands on the same side whatever else is in the snapshot.
    half = table.slice(0, 1000)
    assert np.array_equal(holdout_mask(half, CONFIG.data), mask[:1000])


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


def test_missing_column_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 10, seed=1).drop(["amount"]), path)
    with pytest.raises(DataError, match=f"{path.as_uri()} lacks column\\(s\\) amount"):
        read_table([path.as_uri()], "parquet", ["amount", "hour"])


def test_every_holdout_seed_gives_its_own_key_split() -> None:
    table = transactions(date(2026, 1, 1), 2000, seed=1)
    masks = {}
    for seed in (0, 1, 2, 9, 10, 11, 12345678, 123456789):
        data = CONFIG.data.model_copy(
            update={"holdout": CONFIG.data.holdout.model_copy(update={"seed": seed})}
        )
        masks[seed] = holdout_mask(table, data).tobytes()
    assert len(set(masks.values())) == len(masks)


@pytest.mark.parametrize("key_column", ["transaction_id", None])
def test_a_tuning_validation_split_is_carved_from_the_training_rows_only(key_column: str | None) -> None:
    from airflow_trainpipe.config.data import ValidationSplit

    data = CONFIG.data.model_copy(
        update={"holdout": CONFIG.data.holdout.model_copy(update={"key_column": key_column})}
    )
    table = transactions(date(2026, 1, 1), 20_000, seed=1)
    plain = HoldoutSplit(data)
    carved = HoldoutSplit(data, ValidationSplit(fraction=0.25, seed=7))
    holdout, validation = carved.sides_at(table, 0)
    # The gate's holdout is exactly the one a run without tuning uses; no row is on both sides.
    assert np.array_equal(holdout, plain.mask_at(table, 0))
    assert not (holdout & validation).any()
    assert 0.23 < validation.sum() / (~holdout).sum() < 0.27
    assert not plain.sides_at(table, 0)[1].any()
    # Position (or key) decides, not batching: a later slice gets the same validation rows.
    assert np.array_equal(carved.sides_at(table.slice(5_000, 3_000), 5_000)[1], validation[5_000:8_000])
