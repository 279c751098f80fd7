"""The fit stage: fitted on training rows only, once per run, reused by a retry on the same data."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.data.snapshots.manifests import resolve_snapshot
from airflow_trainpipe.examples.synthetic import transactions, write_day
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import PREPARED_FILE, PreparedData, fit, prepare
from airflow_trainpipe.runtime.data.reader import ChangedDataError, DataError, data_columns, holdout_mask
from tests.conftest import EXAMPLE_CONFIGS

CONFIG = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
TASK = "binary_classification"


def _fit(files: list[str], **kwargs: object) -> PreparedData:
    return fit(files, CONFIG.data, CONFIG.features, TASK, **kwargs)  # type: ignore[arg-type]


def test_holdout_rows_never_influence_the_fitted_transform(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2)
    before = _fit(files).transform
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
    after = _fit(files).transform
    assert after.to_json() == before.to_json() and after.hash == before.hash
    # ...while a training row does move them: the test can fail.
    first_train = int(np.flatnonzero(~mask)[0])
    amount = table.column("amount").to_numpy().copy()
    amount[first_train] = 1e9
    pq.write_table(table.set_column(table.column_names.index("amount"), "amount", pa.array(amount)), path)
    assert _fit(files).transform.hash != before.hash


def test_the_block_index_counts_each_row_groups_split(tmp_path: Path) -> None:
    table = transactions(date(2026, 1, 1), 1500, seed=2)
    for part in range(2):
        pq.write_table(table.slice(part * 800, 800), tmp_path / f"part-{part}.parquet", row_group_size=300)
    files = [(tmp_path / f"part-{part}.parquet").as_uri() for part in range(2)]
    prepared = _fit(files)
    assert [(b.file, b.row_group, b.first_row, b.rows) for b in prepared.blocks] == [
        (0, 0, 0, 300),
        (0, 1, 300, 300),
        (0, 2, 600, 200),
        (1, 0, 800, 300),
        (1, 1, 1100, 300),
        (1, 2, 1400, 100),
    ]
    # Each block's holdout rows are those the split of the whole snapshot gives its rows.
    whole = pa.concat_tables([pq.read_table(f.removeprefix("file://")) for f in files])
    mask = holdout_mask(whole, CONFIG.data)
    reader = BlockReader(files, prepared.identities, CONFIG.data, data_columns(CONFIG.data))
    for block in prepared.blocks:
        _, held = reader.parts(block)
        assert block.holdout_rows == int(mask[block.first_row : block.first_row + block.rows].sum())
        assert held.column("transaction_id") == whole.column("transaction_id").filter(pa.array(mask)).slice(
            int(mask[: block.first_row].sum()), block.holdout_rows
        )
    assert prepared.train_rows + prepared.holdout_rows == 1500
    assert PreparedData.from_json(prepared.to_json()) == prepared


def test_null_labels_are_refused_with_the_column_named(tmp_path: Path) -> None:
    table = transactions(date(2026, 1, 1), 50, seed=1)
    labels = pa.array([None, *table.column("is_fraud").to_pylist()[1:]], pa.int64())
    path = tmp_path / "part.parquet"
    pq.write_table(table.set_column(table.column_names.index("is_fraud"), "is_fraud", labels), path)
    with pytest.raises(DataError, match="label column 'is_fraud' has 1 null value"):
        _fit([path.as_uri()])


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_nan_or_infinite_labels_are_refused_with_the_column_named(tmp_path: Path, bad: float) -> None:
    table = transactions(date(2026, 1, 1), 50, seed=1)
    labels = pa.array([bad, *map(float, table.column("is_fraud").to_pylist()[1:])], pa.float64())
    path = tmp_path / "part.parquet"
    pq.write_table(table.set_column(table.column_names.index("is_fraud"), "is_fraud", labels), path)
    with pytest.raises(DataError, match="label column 'is_fraud' has 1 NaN or infinite value"):
        _fit([path.as_uri()])


def test_a_snapshot_too_small_to_split_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 1, seed=1), path)
    with pytest.raises(
        DataError,
        match=r"holdout split left 1 training and 0 holdout rows|holdout split left 0 training and 1 holdout rows",
    ):
        _fit([path.as_uri()])


def test_a_file_overwritten_since_validation_is_refused_by_name(tmp_path: Path) -> None:
    data = CONFIG.data.model_copy(update={"uri": tmp_path.as_uri()})
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2, files=2)
    manifest = resolve_snapshot(data, "ds=2026-01-01")
    verified = fit(files, data, CONFIG.features, TASK, manifest)
    plain = fit(files, data, CONFIG.features, TASK)
    assert verified.blocks == plain.blocks and verified.transform.hash == plain.transform.hash
    # Overwritten in place with other rows of the same schema, as a re-run export would.
    path = Path(files[1].removeprefix("file://"))
    pq.write_table(transactions(date(2026, 1, 1), 700, seed=3), path)
    with pytest.raises(
        ChangedDataError,
        match=f"{files[1]} changed since it was validated: .* the snapshot {manifest.digest}",
    ):
        fit(files, data, CONFIG.features, TASK, manifest)


def test_a_block_of_a_file_changed_after_the_fit_is_refused_by_name(tmp_path: Path) -> None:
    files = write_day(tmp_path.as_uri(), date(2026, 1, 1), 1500, seed=2, files=2)
    prepared = _fit(files)
    reader = BlockReader(files, prepared.identities, CONFIG.data, data_columns(CONFIG.data))
    assert reader.parts(prepared.blocks[-1])[0].num_rows == prepared.blocks[-1].train_rows
    pq.write_table(transactions(date(2026, 1, 1), 700, seed=3), files[1].removeprefix("file://"))
    with pytest.raises(ChangedDataError, match=f"{files[1]} changed since the fit stage read it"):
        reader.parts(prepared.blocks[-1])


def test_a_retry_reuses_the_runs_fit_and_refits_when_the_data_or_config_changed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="airflow_trainpipe.runtime.data.prepare")
    files = write_day((tmp_path / "data").as_uri(), date(2026, 1, 1), 1500, seed=2)
    run_dir = (tmp_path / "run").as_uri()
    first = prepare(files, CONFIG.data, CONFIG.features, TASK, None, run_dir)
    saved = tmp_path / "run" / PREPARED_FILE
    assert PreparedData.from_json(saved.read_text()) == first
    # A marker in the saved file tells a reuse from a refit that happens to give the same numbers.
    document = json.loads(saved.read_text())
    document["fit_seconds"] = -1.0
    saved.write_text(json.dumps(document))
    assert prepare(files, CONFIG.data, CONFIG.features, TASK, None, run_dir).fit_seconds == -1.0
    assert "reusing the fit of an earlier attempt" in caplog.text

    clipped = CONFIG.features.model_copy(update={"numeric": {}})
    assert prepare(files, CONFIG.data, clipped, TASK, None, run_dir).fit_seconds >= 0
    assert "refitting" in caplog.text
    pq.write_table(transactions(date(2026, 1, 1), 1500, seed=5), files[0].removeprefix("file://"))
    refit = prepare(files, CONFIG.data, CONFIG.features, TASK, None, run_dir)
    assert refit.transform.hash != first.transform.hash and refit.fit_seconds >= 0


def test_an_unreadable_saved_fit_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = write_day((tmp_path / "data").as_uri(), date(2026, 1, 1), 1500, seed=2)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / PREPARED_FILE).write_text('{"key": ')
    prepared = prepare(files, CONFIG.data, CONFIG.features, TASK, None, (tmp_path / "run").as_uri())
    assert prepared.transform.hash == _fit(files).transform.hash
    assert "ignoring unreadable" in caplog.text
    assert not np.isnan(prepared.fit_seconds)


def test_a_validation_split_that_leaves_no_rows_names_its_fraction(tmp_path: Path) -> None:
    from airflow_trainpipe.config.data import ValidationSplit

    path = tmp_path / "part.parquet"
    pq.write_table(transactions(date(2026, 1, 1), 40, seed=1), path)
    with pytest.raises(DataError, match=r"validation split \(data.validation.fraction 0.001\) left no rows"):
        _fit([path.as_uri()], validation=ValidationSplit(fraction=0.001, seed=7))
