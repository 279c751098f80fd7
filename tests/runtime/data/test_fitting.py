"""Fitting declared transforms batch by batch: statistics of small known columns, worked out by hand."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.features import FeaturesSection
from airflow_trainpipe.runtime.data.fitting import TransformFitter
from airflow_trainpipe.runtime.data.transform import FORMAT


def _fitter(
    numeric: dict[str, dict[str, Any]] | None = None,
    categorical: dict[str, dict[str, Any]] | None = None,
    task: str = "binary_classification",
) -> TransformFitter:
    numeric, categorical = numeric or {}, categorical or {}
    data = DataSection.model_validate(
        {
            "uri": "file:///data",
            "label": "y",
            "features": {"numeric": list(numeric), "categorical": list(categorical)},
        }
    )
    features = FeaturesSection.model_validate({"numeric": numeric, "categorical": categorical})
    return TransformFitter(data, features, task)


def _fit(fitter: TransformFitter, *batches: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """Both passes over the batches, as runtime.data drives them; the fitted columns by name."""
    tables = [pa.table(batch) for batch in batches]
    for table in tables:
        fitter.update(table)
    if fitter.needs_second_pass:
        fitter.start_second_pass()
        for table in tables:
            fitter.update_clipped(table)
    return {column["name"]: column for column in fitter.result().columns}


def _fit_one(transform: dict[str, Any], values: list[float | None]) -> dict[str, Any]:
    return _fit(_fitter({"x": transform}), {"x": values, "y": [0] * len(values)})["x"]


def test_standardize_and_mean_fill_use_the_present_values_only() -> None:
    fitted = _fit_one({}, [1.0, 2.0, None, 3.0, float("nan"), 4.0, float("inf")])
    assert fitted["center"] == fitted["fill"] == 2.5
    assert fitted["scale"] == pytest.approx(math.sqrt(1.25), rel=1e-12)  # population std of 1, 2, 3, 4
    assert fitted["clip"] is None and fitted["log1p"] is False


def test_min_max_scales_by_the_training_range() -> None:
    fitted = _fit_one({"scale": "min_max", "fill": "zero"}, [5.0, -3.0, 9.0])
    assert (fitted["center"], fitted["scale"], fitted["fill"]) == (-3.0, 12.0, 0.0)


def test_log1p_comes_before_the_statistics() -> None:
    fitted = _fit_one({"log1p": True, "fill": "median"}, [0.0, math.e - 1, math.e**2 - 1, -1.0])
    # log1p gives 0, 1, 2 and -inf (missing)
    assert fitted["center"] == pytest.approx(1.0, rel=1e-12)
    assert fitted["scale"] == pytest.approx(math.sqrt(2 / 3), rel=1e-12)
    assert fitted["fill"] == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize(
    ("fill", "expected"), [("median", 2.0), ("mean", 13 / 3), ("zero", 0.0), ("error", None)]
)
def test_each_fill_rule_stores_its_value(fill: str, expected: float | None) -> None:
    assert _fit_one({"fill": fill, "scale": "none"}, [10.0, 1.0, None, 2.0])["fill"] == expected


def test_scale_none_keeps_values_as_they_are() -> None:
    fitted = _fit_one({"scale": "none"}, [10.0, 20.0])
    assert (fitted["center"], fitted["scale"]) == (0.0, 1.0)


@pytest.mark.parametrize("scale", ["standardize", "min_max"])
def test_a_constant_column_gets_scale_one_instead_of_dividing_by_zero(scale: str) -> None:
    assert _fit_one({"scale": scale}, [4.0, 4.0, 4.0])["scale"] == 1.0


def test_an_all_missing_column_fits_neutral_numbers() -> None:
    fitted = _fit_one({"fill": "median"}, [None, None])
    assert (fitted["fill"], fitted["center"], fitted["scale"]) == (0.0, 0.0, 1.0)


def test_clipping_bounds_are_training_quantiles_and_scaling_uses_the_clipped_values() -> None:
    values = [*map(float, range(1, 101)), 1000.0]
    fitter = _fitter({"x": {"clip": {"lower": 0.0, "upper": 0.9}, "fill": "median"}})
    assert fitter.needs_second_pass
    fitted = _fit(fitter, {"x": values[:40], "y": [0] * 40}, {"x": values[40:], "y": [0] * 61})["x"]
    high = float(np.quantile(values, 0.9, method="inverted_cdf"))
    assert (fitted["clip"], high) == ([1.0, high], 91.0)
    clipped = np.clip(values, 1.0, 91.0)
    assert fitted["center"] == pytest.approx(clipped.mean(), rel=1e-12)
    assert fitted["scale"] == pytest.approx(clipped.std(), rel=1e-12)
    assert fitted["fill"] == 51.0  # the median lies inside the bounds


def test_a_median_outside_the_clip_bounds_is_clipped_too() -> None:
    values = [1.0, 1.0, 1.0, 50.0, 100.0]
    fitted = _fit_one({"clip": {"lower": 0.7, "upper": 1.0}, "fill": "median"}, values)
    assert fitted["clip"] == [50.0, 100.0] and fitted["fill"] == 50.0  # the median 1 lies below


def test_a_clipped_column_without_values_stays_unclipped() -> None:
    fitted = _fit_one({"clip": {"upper": 0.5}}, [None, None, None])
    assert fitted["clip"] is None and (fitted["center"], fitted["scale"]) == (0.0, 1.0)


def test_vocabularies_keep_the_most_frequent_values_across_batches_ties_by_value() -> None:
    fitter = _fitter(categorical={"c": {"encode": "index", "max_categories": 3}})
    first = {"c": ["b", "a", "d", None, "d"], "y": [0] * 5}
    second = {"c": ["c", "a", "c", "b", None], "y": [1] * 5}
    fitted = _fit(fitter, first, second)["c"]
    # counts: a 2, b 2, c 2, d 2 -> the first three by value; None is not a category
    assert fitted["categories"] == ["a", "b", "c"]
    assert (fitted["encode"], fitted["source_type"]) == ("index", "string")


def test_without_a_limit_every_seen_value_is_kept_in_sorted_order() -> None:
    fitted = _fit(_fitter(categorical={"c": {}}), {"c": ["z", "y", "z", "x"], "y": [0] * 4})["c"]
    assert fitted["categories"] == ["x", "y", "z"]


def test_one_hot_keeps_the_top_counts_and_integer_columns_are_recorded_as_long() -> None:
    fitter = _fitter(categorical={"code": {"encode": "one_hot", "max_categories": 2}})
    fitted = _fit(fitter, {"code": [7, 3, 3, 12, 12, 12, 5], "y": [0] * 7})["code"]
    assert fitted["categories"] == ["12", "3"]  # compared as strings, sorted as strings
    assert fitted["source_type"] == "long"


def test_hash_encoding_fits_no_vocabulary() -> None:
    fitted = _fit(
        _fitter(categorical={"c": {"encode": "hash", "buckets": 8}}), {"c": ["a", "b"], "y": [0, 1]}
    )["c"]
    assert fitted["buckets"] == 8 and "categories" not in fitted


def test_a_regression_label_is_standardised_by_its_training_moments() -> None:
    fitter = _fitter({"x": {}}, task="regression")
    _fit(fitter, {"x": [0.0, 0.0], "y": [2.0, 4.0]}, {"x": [0.0], "y": [9.0]})
    document = fitter.result().document
    assert document["format"] == FORMAT
    label = document["label"]
    assert (label["name"], label["task"]) == ("y", "regression")
    assert (label["mean"], label["std"]) == pytest.approx((5.0, math.sqrt(26 / 3)), rel=1e-12)


@pytest.mark.parametrize(
    ("task", "labels"), [("binary_classification", [0, 1, 1]), ("regression", [3.0] * 3)]
)
def test_labels_that_need_no_scaling_keep_mean_zero_and_std_one(task: str, labels: list[float]) -> None:
    fitter = _fitter({"x": {}}, task=task)
    _fit(fitter, {"x": [1.0, 2.0, 3.0], "y": labels})
    label = fitter.result().document["label"]
    assert (label["std"], label["task"]) == (1.0, task)
    assert label["mean"] == (0.0 if task == "binary_classification" else 3.0)


def test_columns_come_out_numeric_first_in_declared_order() -> None:
    fitter = _fitter({"b": {}, "a": {}}, {"z": {}, "k": {}})
    fitted = _fit(fitter, {"a": [1.0], "b": [2.0], "k": ["x"], "z": ["y"], "y": [0]})
    assert list(fitted) == ["b", "a", "z", "k"]
    assert [c["kind"] for c in fitted.values()] == ["numeric", "numeric", "categorical", "categorical"]


def test_a_multiclass_label_fits_the_classes_its_training_rows_hold() -> None:
    fitter = _fitter({"x": {}}, task="multiclass_classification")
    _fit(fitter, {"x": [1.0, 2.0], "y": ["web", "app"]}, {"x": [3.0], "y": ["card"]})
    assert fitter.result().document["label"]["classes"] == ["app", "card", "web"]


def test_integer_classes_are_ordered_as_numbers() -> None:
    fitter = _fitter({"x": {}}, task="multiclass_classification")
    _fit(fitter, {"x": [1.0] * 3, "y": [10, 2, 1]})
    assert fitter.result().document["label"]["classes"] == ["1", "2", "10"]


def test_one_class_is_not_a_multiclass_label() -> None:
    from airflow_trainpipe.runtime.data.reader import DataError

    fitter = _fitter({"x": {}}, task="multiclass_classification")
    fitter.update(pa.table({"x": [1.0, 2.0], "y": ["a", "a"]}))
    with pytest.raises(DataError, match=r"label column .y. holds 1 class.*at least 2"):
        fitter.result()


def test_too_many_classes_are_refused_while_fitting() -> None:
    from airflow_trainpipe.runtime.data.fitting import MAX_CLASSES
    from airflow_trainpipe.runtime.data.reader import DataError

    fitter = _fitter({"x": {}}, task="multiclass_classification")
    rows = MAX_CLASSES + 1
    with pytest.raises(DataError, match=f"more than {MAX_CLASSES} classes"):
        fitter.update(pa.table({"x": [1.0] * rows, "y": [f"c{i}" for i in range(rows)]}))


def test_a_negative_relevance_is_refused_for_ranking() -> None:
    from airflow_trainpipe.runtime.data.reader import DataError

    fitter = _fitter({"x": {}}, task="ranking")
    with pytest.raises(DataError, match="negative relevance"):
        fitter.update(pa.table({"x": [1.0, 2.0], "y": [1, -1]}))
