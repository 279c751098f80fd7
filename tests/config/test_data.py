"""config.data: feature columns, the holdout split, the completeness wait and the data section."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from airflow_trainpipe.config.data import DataSection, FeatureColumns, HoldoutSection, WaitSection


def _rejected(model: type[BaseModel], data: dict[str, Any]) -> list[tuple[tuple[Any, ...], str]]:
    """(location, message) of every problem, cross-field ones unpacked as the loader does."""
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    found: list[tuple[tuple[Any, ...], str]] = []
    for error in caught.value.errors(include_url=False):
        subs = error.get("ctx", {}).get("problems") or [((), error["msg"].removeprefix("Value error, "))]
        found.extend(((*error["loc"], *loc), message) for loc, message in subs)
    return found


def _data(**overrides: Any) -> dict[str, Any]:
    return {"uri": "data/tx", "label": "is_fraud", "features": {"numeric": ["amount"]}, **overrides}


def test_features_list_numeric_before_categorical() -> None:
    columns = FeatureColumns(numeric=["amount", "hour"], categorical=["country"])
    assert columns.all == ["amount", "hour", "country"]


def test_a_model_needs_at_least_one_feature() -> None:
    assert _rejected(FeatureColumns, {"numeric": [], "categorical": []}) == [
        ((), "declare at least one feature column under `numeric`, `categorical` or `text`")
    ]


def test_a_column_declared_twice_is_reported_at_each_repeat() -> None:
    data = {"numeric": ["a", "b", "a"], "categorical": ["b"]}
    assert _rejected(FeatureColumns, data) == [
        (("numeric", 2), "column 'a' is declared twice"),
        (("categorical", 0), "column 'b' is declared twice"),
    ]


def test_a_categorical_only_model_is_fine() -> None:
    assert FeatureColumns(categorical=["country"]).all == ["country"]


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1, 1.5])
def test_the_holdout_fraction_is_strictly_between_0_and_1(fraction: float) -> None:
    [(loc, _message)] = _rejected(HoldoutSection, {"fraction": fraction})
    assert loc == ("fraction",)


def test_holdout_defaults_hold_out_a_fifth_with_seed_0() -> None:
    holdout = HoldoutSection()
    assert (holdout.fraction, holdout.seed, holdout.key_column) == (0.2, 0, None)
    assert HoldoutSection(fraction=0.999).fraction == 0.999


def test_a_negative_holdout_seed_is_rejected() -> None:
    assert _rejected(HoldoutSection, {"seed": -1}) == [
        (("seed",), "Input should be greater than or equal to 0")
    ]


def test_wait_defaults_to_a_deferrable_wait_for_the_success_marker() -> None:
    wait = WaitSection()
    assert (wait.marker, wait.min_rows, wait.mode) == ("_SUCCESS", None, "deferrable")
    assert (wait.poke_interval, wait.timeout) == (timedelta(minutes=5), timedelta(hours=12))


def test_a_row_count_alone_is_a_completion_rule() -> None:
    wait = WaitSection.model_validate({"marker": None, "min_rows": 100})
    assert (wait.marker, wait.min_rows) == (None, 100)


def test_without_marker_or_row_count_an_empty_partition_would_count_as_complete() -> None:
    [((), message)] = _rejected(WaitSection, {"marker": None})
    assert message.startswith("set `marker`, `min_rows` or both")


@pytest.mark.parametrize("marker", ["", "a/b", "../_SUCCESS", ".", "..", "a\\b"])
def test_the_marker_is_a_file_name_inside_the_partition(marker: str) -> None:
    assert _rejected(WaitSection, {"marker": marker}) == [
        (("marker",), f"expected a file name inside the partition, got {marker!r}")
    ]


@pytest.mark.parametrize("field", ["poke_interval", "timeout"])
def test_wait_durations_must_be_positive(field: str) -> None:
    assert _rejected(WaitSection, {field: "0s"}) == [
        ((field,), "expected a duration greater than zero, got 0s")
    ]


def test_a_zero_row_count_is_not_a_rule() -> None:
    [(loc, message)] = _rejected(WaitSection, {"min_rows": 0})
    assert (loc, message) == (("min_rows",), "Input should be greater than 0")


def test_data_defaults_read_parquet_partitions_by_logical_date() -> None:
    data = DataSection.model_validate(_data())
    assert (data.partition, data.format) == ("ds={{ ds }}", "parquet")
    assert data.holdout == HoldoutSection() and data.wait == WaitSection()


@pytest.mark.parametrize("partition", ["region=eu/ds={{ ds }}", "a..b/{{ ds_nodash }}", "static"])
def test_relative_partitions_and_templates_are_accepted(partition: str) -> None:
    assert DataSection.model_validate(_data(partition=partition)).partition == partition


@pytest.mark.parametrize("partition", ["/ds={{ ds }}", "../other", "ds={{ ds }}/.."])
def test_a_partition_cannot_leave_the_data_uri(partition: str) -> None:
    assert _rejected(DataSection, _data(partition=partition)) == [
        (("partition",), f"partition is a relative sub-path without '..', got {partition!r}")
    ]


@pytest.mark.parametrize(
    ("partition", "reason"),
    [
        ("ds={{ ds ", "unexpected end of template"),
        ("ds={% if %}", "Expected an expression"),
        ("ds={{ ds }", "unexpected '}'"),
    ],
)
def test_a_template_syntax_error_is_caught_at_parse_time(partition: str, reason: str) -> None:
    [(loc, message)] = _rejected(DataSection, _data(partition=partition))
    assert loc == ("partition",)
    assert message.startswith(f"invalid Airflow template {partition!r}: ") and reason in message


def test_the_label_cannot_also_be_a_feature() -> None:
    data = _data(label="country", features={"numeric": ["amount"], "categorical": ["country"]})
    assert _rejected(DataSection, data) == [
        (("label",), "label column 'country' is also listed as a feature")
    ]


@pytest.mark.parametrize("column", ["", " amount"])
def test_a_label_is_a_column_name(column: str) -> None:
    [(loc, _message)] = _rejected(DataSection, _data(label=column))
    assert loc == ("label",)


def test_the_format_is_parquet_or_csv() -> None:
    assert DataSection.model_validate(_data(format="csv")).format == "csv"
    [(loc, message)] = _rejected(DataSection, _data(format="json"))
    assert loc == ("format",) and message == "Input should be 'parquet' or 'csv'"


def test_a_window_minimum_above_its_size_is_located(tmp_path) -> None:
    problem = _window_problem(tmp_path, "    window: {partitions: 30, min_partitions: 31}\n")
    assert "data.window.min_partitions" in problem and "31 is more than the window's 30" in problem


def test_a_window_over_an_undated_partition_is_refused(tmp_path) -> None:
    problem = _window_problem(tmp_path, "    window: {partitions: 30}\n", partition="latest")
    assert "data.window" in problem and "renders the same path for every date" in problem


def test_a_window_parses_with_its_defaults(tmp_path) -> None:
    from datetime import timedelta

    from airflow_trainpipe.config import load_config

    config = load_config(_with_data_lines(tmp_path, "  window: {partitions: 30, min_partitions: 27}\n"))
    window = config.data.window
    assert (window.partitions, window.required, window.every) == (30, 27, timedelta(days=1))


def _with_data_lines(tmp_path, lines: str, partition: str = "ds={{ ds }}"):
    from tests.conftest import EXAMPLE_CONFIGS

    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    text = text.replace("  format: parquet\n", "  format: parquet\n" + lines)
    text = text.replace('partition: "ds={{ ds }}"', f"partition: {partition!r}")
    path = tmp_path / "windowed.yaml"
    path.write_text(text)
    return path


def _window_problem(tmp_path, lines: str, partition: str = "ds={{ ds }}") -> str:
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.core.exceptions import ConfigError

    path = _with_data_lines(tmp_path, lines.replace("    ", "  "), partition)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(path) in str(caught.value)
    return str(caught.value)
