"""Fitting the declared transforms and applying the fitted document to raw rows."""

from __future__ import annotations

import hashlib
from datetime import date
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import PipelineConfig, parse_config
from airflow_trainpipe.examples.synthetic import transactions
from airflow_trainpipe.runtime.data.prepare import fit
from airflow_trainpipe.runtime.data.reader import holdout_mask, read_table
from airflow_trainpipe.runtime.data.transform import (
    FittedTransform,
    TransformError,
    bucket_of,
)
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.transforms import small_classifier, tickets_transform

BASE = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
FEATURES = BASE[BASE.index("features:\n") : BASE.index("validation:")]


def _config(features: str) -> PipelineConfig:
    return parse_config(BASE.replace(FEATURES, features + "\n"))


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three files with some missing values, so fill statistics and indicators have work to do."""
    root = tmp_path_factory.mktemp("snapshot")
    uris = []
    for part in range(3):
        table = transactions(date(2026, 1, 1 + part), 2000, seed=part)
        distance = table.column("distance_from_home_km").to_numpy().copy()
        distance[::7] = np.nan
        table = table.set_column(
            table.column_names.index("distance_from_home_km"),
            "distance_from_home_km",
            pa.array(distance, from_pandas=True),
        )
        pq.write_table(table, root / f"part-{part}.parquet")
        uris.append((root / f"part-{part}.parquet").as_uri())
    return uris


def _fit(config: PipelineConfig, files: list[str]) -> FittedTransform:
    return fit(files, config.data, config.features, config.training.task).transform


def _by_name(transform: FittedTransform) -> dict[str, dict]:
    return {spec["name"]: spec for spec in transform.columns}


def test_same_config_and_data_give_the_same_hash_and_numbers(files: list[str]) -> None:
    config = _config(FEATURES)
    first, second = _fit(config, files), _fit(config, files)
    assert first.to_json() == second.to_json()
    assert first.hash == second.hash == "sha256:" + hashlib.sha256(first.to_json().encode()).hexdigest()
    assert FittedTransform.from_json(first.to_json()) == first


def test_small_row_groups_fit_the_same_transform(files: list[str], tmp_path: Path) -> None:
    """Quantiles, vocabularies and the split do not depend on the blocks; moments agree to rounding."""
    config = _config(FEATURES)
    regrouped = []
    for uri in files:
        path = tmp_path / uri.rsplit("/", 1)[1]
        pq.write_table(pq.read_table(uri.removeprefix("file://")), path, row_group_size=97)
        regrouped.append(path.as_uri())
    assert pq.ParquetFile(tmp_path / "part-0.parquet").num_row_groups == 21
    whole, streamed = _by_name(_fit(config, files)), _by_name(_fit(config, regrouped))
    for name, spec in whole.items():
        for key, value in spec.items():
            if key in ("center", "scale") or (
                key == "fill" and spec["kind"] == "numeric" and name != "distance_from_home_km"
            ):
                assert streamed[name][key] == pytest.approx(value, rel=1e-12), (name, key)
            else:
                assert streamed[name][key] == value, (name, key)


@pytest.mark.parametrize(
    "old, new",
    [
        (
            "amount: {log1p: true, clip: {lower: 0.001, upper: 0.999}}",
            "amount: {log1p: true, clip: {lower: 0.001, upper: 0.99}}",
        ),
        (
            "amount: {log1p: true, clip: {lower: 0.001, upper: 0.999}}",
            "amount: {clip: {lower: 0.001, upper: 0.999}}",
        ),
        ("fill: median, missing_indicator: true", "fill: mean, missing_indicator: true"),
        ("fill: median, missing_indicator: true", "fill: median, missing_indicator: false"),
        ("account_age_days: {scale: min_max}", "account_age_days: {scale: standardize}"),
        ("channel: {encode: one_hot, max_categories: 3}", "channel: {encode: one_hot, max_categories: 2}"),
        ("country: {encode: index, max_categories: 6}", "country: {encode: hash, buckets: 16}"),
    ],
)
def test_changing_one_transform_changes_the_hash(files: list[str], old: str, new: str) -> None:
    assert old in FEATURES
    assert _fit(_config(FEATURES.replace(old, new)), files).hash != _fit(_config(FEATURES), files).hash


def test_fitted_numbers_are_those_of_the_training_rows(files: list[str]) -> None:
    config = _config(FEATURES)
    fitted = _by_name(_fit(config, files))
    table = read_table(files, "parquet", [*config.data.features.all, config.data.label, "transaction_id"])
    train = table.filter(pa.array(~holdout_mask(table, config.data)))

    amount = np.log1p(train.column("amount").to_numpy())
    low, high = (float(np.quantile(amount, q, method="inverted_cdf")) for q in (0.001, 0.999))
    clipped = np.clip(amount, low, high)
    assert fitted["amount"]["clip"] == [low, high]
    assert fitted["amount"]["center"] == pytest.approx(clipped.mean(), rel=1e-12)
    assert fitted["amount"]["scale"] == pytest.approx(clipped.std(), rel=1e-10)

    distance = train.column("distance_from_home_km").to_numpy(zero_copy_only=False)
    present = distance[~np.isnan(distance)]
    assert fitted["distance_from_home_km"]["fill"] == float(np.quantile(present, 0.5, method="inverted_cdf"))
    assert fitted["distance_from_home_km"]["center"] == pytest.approx(present.mean(), rel=1e-12)

    age = train.column("account_age_days").to_numpy()
    assert (fitted["account_age_days"]["center"], fitted["account_age_days"]["scale"]) == (
        age.min(),
        age.max() - age.min(),
    )

    channels, counts = np.unique(train.column("channel").to_numpy(zero_copy_only=False), return_counts=True)
    top = sorted(channels[np.argsort(-counts, kind="stable")][:3].tolist())
    assert fitted["channel"]["categories"] == top and len(channels) == 4
    assert len(fitted["country"]["categories"]) == 6


def _fraud_rows(n: int = 6) -> pa.Table:
    return transactions(date(2026, 2, 1), n, seed=9).drop(["transaction_id", "is_fraud"])


def test_unseen_categories_go_to_other_and_unknown(files: list[str]) -> None:
    transform = _fit(_config(FEATURES), files)
    rows = _fraud_rows()
    rows = rows.set_column(rows.column_names.index("channel"), "channel", pa.array(["fax"] * 6))
    rows = rows.set_column(rows.column_names.index("country"), "country", pa.array(["XX", None] * 3))
    x = transform.features(rows)
    spec = _by_name(transform)
    width = len(spec["channel"]["categories"]) + 1
    one_hot = x[:, 7 : 7 + width]  # after 6 numeric values and the distance indicator
    assert np.all(one_hot[:, -1] == 1) and np.all(one_hot[:, :-1] == 0)
    assert np.all(x[:, -1] == 0)  # country index: 0 is unknown or missing


def test_missing_numbers_are_filled_and_flagged(files: list[str]) -> None:
    transform = _fit(_config(FEATURES), files)
    spec = _by_name(transform)["distance_from_home_km"]
    rows = _fraud_rows()
    rows = rows.set_column(
        rows.column_names.index("distance_from_home_km"),
        "distance_from_home_km",
        pa.array([None, np.nan, 1.0, 2.0, 3.0, 4.0], pa.float64()),
    )
    x = transform.features(rows)
    assert np.allclose(x[:2, 3], (spec["fill"] - spec["center"]) / spec["scale"])
    assert x[:, 4].tolist() == [1, 1, 0, 0, 0, 0]  # the missing indicator follows its value
    absent = transform.features(rows.drop(["distance_from_home_km"]))
    assert np.array_equal(absent[:, [3, 4]], np.tile(x[0, [3, 4]], (6, 1)))  # optional: absent = all missing


def test_a_missing_required_column_is_named(files: list[str]) -> None:
    transform = _fit(_config(FEATURES), files)
    with pytest.raises(TransformError, match="required column 'hour' is missing"):
        transform.features(_fraud_rows().drop(["hour"]))


def test_declared_errors_name_the_column(files: list[str]) -> None:
    config = _config(
        FEATURES.replace("account_age_days: {scale: min_max}", "account_age_days: {fill: error}")
    )
    transform = _fit(config, files)
    rows = _fraud_rows()
    rows = rows.set_column(
        rows.column_names.index("account_age_days"),
        "account_age_days",
        pa.array([None, 1, 2, 3, 4, 5], pa.int64()),
    )
    with pytest.raises(
        TransformError, match="column 'account_age_days' has 1 missing value\\(s\\) and declares fill: error"
    ):
        transform.features(rows)
    text = FEATURES.replace(
        "country: {encode: index, max_categories: 6}", "country: {encode: index, missing: error}"
    )
    strict = _fit(_config(text), files)
    rows = _fraud_rows().set_column(
        _fraud_rows().column_names.index("country"), "country", pa.array(["NL", None, "DE", "XX", "NL", "NL"])
    )
    with pytest.raises(TransformError, match="column 'country' has 1 missing value"):
        strict.features(rows)
    with pytest.raises(TransformError, match="column 'hour' is not numeric"):
        transform.features(_fraud_rows().set_column(1, "hour", pa.array(["noon"] * 6)))


def test_hash_buckets_are_stable_and_take_unseen_values(files: list[str]) -> None:
    transform = _fit(
        _config(
            FEATURES.replace(
                "country: {encode: index, max_categories: 6}", "country: {encode: hash, buckets: 16}"
            )
        ),
        files,
    )
    assert transform.cardinalities == [17]
    rows = _fraud_rows(4).set_column(
        _fraud_rows(4).column_names.index("country"), "country", pa.array(["NL", "never-seen", None, "NL"])
    )
    codes = transform.features(rows)[:, -1]
    expected = int.from_bytes(hashlib.blake2b(b"NL", digest_size=8).digest(), "little") % 16 + 1
    assert codes[0] == codes[3] == expected and codes[1] >= 1 and codes[2] == 0
    assert bucket_of(["NL"], 16)[0] + 1 == expected


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(TransformError, match=r"unsupported transform format 'trainpipe.transform/99'"):
        FittedTransform({"format": "trainpipe.transform/99", "columns": [], "label": {}})


def test_regression_labels_round_trip(tmp_path: Path) -> None:
    config = _config(FEATURES)
    table = transactions(date(2026, 1, 1), 500, seed=1)
    pq.write_table(table, tmp_path / "p.parquet")
    transform = fit([(tmp_path / "p.parquet").as_uri()], config.data, config.features, "regression").transform
    targets = transform.labels(table)
    assert abs(float(targets.mean())) < 0.2
    assert np.allclose(transform.label_values(targets), table.column("is_fraud").to_numpy(), atol=1e-5)


def test_the_in_memory_predictor_applies_transform_then_network(files: list[str]) -> None:
    import torch

    from airflow_trainpipe.runtime.models import build_model
    from airflow_trainpipe.runtime.serving import TransformedNetwork

    transform = _fit(_config(FEATURES), files)
    torch.manual_seed(0)
    network = build_model(
        "tabular_mlp",
        num_numeric=transform.num_dense,
        cardinalities=transform.cardinalities,
        task="binary_classification",
        hidden_sizes=[8],
    )
    rows = _fraud_rows(10)
    with torch.no_grad():
        expected = torch.sigmoid(network(torch.from_numpy(transform.features(rows))).reshape(-1)).numpy()
    predicted = TransformedNetwork.of(transform, network).predict(None, rows.to_pandas())
    np.testing.assert_allclose(predicted, expected, rtol=1e-6)


def test_multiclass_targets_are_class_indices_and_unknown_classes_minus_one(tmp_path: Path) -> None:
    transform, table = tickets_transform(tmp_path)
    assert transform.classes == ["account", "billing", "shipping", "technical"]
    assert transform.num_outputs == 4
    targets = transform.labels(table)
    assert [transform.classes[int(t)] for t in targets[:20]] == table.column("team").to_pylist()[:20]
    unseen = table.slice(0, 2).set_column(
        table.column_names.index("team"), "team", pa.array(["legal", "billing"])
    )
    assert transform.labels(unseen).tolist() == [-1.0, 1.0]


def test_the_multiclass_predictor_gives_a_probability_per_class_by_name(tmp_path: Path) -> None:
    import torch

    from airflow_trainpipe.runtime.serving import TransformedNetwork, signature

    transform, table = tickets_transform(tmp_path)
    network = small_classifier(transform)
    rows = table.slice(0, 10).drop_columns(["team"])
    predicted = TransformedNetwork.of(transform, network).predict(None, rows.to_pandas())
    assert list(predicted.columns) == [*transform.classes, "predicted_label"]  # tests/runtime/test_serving.py
    with torch.no_grad():
        expected = torch.softmax(network(torch.from_numpy(transform.features(rows))), dim=1).numpy()
    np.testing.assert_allclose(predicted[transform.classes].to_numpy(), expected, rtol=1e-5)
    assert [c.name for c in signature(transform).outputs.inputs] == [*transform.classes, "predicted_label"]


def test_ranking_group_codes_are_equal_exactly_for_equal_queries(tmp_path: Path) -> None:
    from airflow_trainpipe.examples.synthetic import search_results

    config = parse_config((EXAMPLE_CONFIGS / "search_ranking.yaml").read_text())
    table = search_results(date(2026, 1, 1), 600, seed=2)
    pq.write_table(table, tmp_path / "s.parquet")
    transform = fit([(tmp_path / "s.parquet").as_uri()], config.data, config.features, "ranking").transform
    assert transform.group == "query_id" and transform.num_outputs == 1
    queries = np.asarray(table.column("query_id").to_pylist())
    for bits in (24, 53):
        codes = transform.group_codes(table, bits=bits)
        assert codes.max() < 2**bits and np.array_equal(codes, np.floor(codes))
        same = codes[:, None] == codes[None, :]
        assert np.array_equal(same, queries[:, None] == queries[None, :])
