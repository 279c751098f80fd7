"""config.validation: expectations and their arguments, Arrow type names, volume and drift rules."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from airflow_trainpipe.config.gx_catalog import EXPECTATIONS
from airflow_trainpipe.config.validation import (
    DriftRule,
    ExpectationRule,
    SchemaContract,
    ValidationSection,
    VolumeRule,
    arrow_type_name,
)

BETWEEN = "expect_column_values_to_be_between"


def _rule_problems(rule: dict[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        ExpectationRule.model_validate(rule)
    [error] = caught.value.errors()
    return list(error["ctx"]["problems"])


def test_a_known_expectation_with_its_arguments_is_accepted() -> None:
    rule = ExpectationRule.model_validate({"type": BETWEEN, "kwargs": {"column": "amount", "min_value": 0}})
    assert rule.kwargs == {"column": "amount", "min_value": 0}


def test_an_unknown_expectation_suggests_the_closest() -> None:
    assert _rule_problems({"type": "expect_column_values_to_be_betwen"}) == [
        (
            ("type",),
            f"unknown Great Expectations expectation 'expect_column_values_to_be_betwen' (did you mean {BETWEEN!r}?)",
        )
    ]


def test_an_unknown_argument_lists_the_ones_the_expectation_takes() -> None:
    allowed = ", ".join((*EXPECTATIONS[BETWEEN][0], *EXPECTATIONS[BETWEEN][1]))
    assert _rule_problems({"type": BETWEEN, "kwargs": {"column": "a", "max": 3}}) == [
        (("kwargs", "max"), f"{BETWEEN} takes no argument 'max'; it takes {allowed}")
    ]


def test_missing_required_arguments_are_named_after_unknown_ones() -> None:
    problems = _rule_problems({"type": BETWEEN, "kwargs": {"colum": "a"}})
    assert [loc for loc, _message in problems] == [("kwargs", "colum"), ("kwargs",)]
    assert "(did you mean 'column'?)" in problems[0][1]
    assert problems[1][1] == f"{BETWEEN} needs column"


def test_an_expectation_without_kwargs_names_every_required_argument() -> None:
    assert _rule_problems({"type": "expect_table_row_count_to_equal"}) == [
        (("kwargs",), "expect_table_row_count_to_equal needs value")
    ]


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("float64", "double"),
        ("float32", "float"),
        ("str", "string"),
        ("utf8", "string"),
        ("boolean", "bool"),
        ("uint8", "uint8"),
        ("large_string", "large_string"),
        ("timestamp[ns]", "timestamp[ns]"),
        ("timestamp[us, tz=Europe/Paris]", "timestamp[us, tz=Europe/Paris]"),
        ("date32[day]", "date32[day]"),
        ("decimal128(10, 2)", "decimal128(10, 2)"),
        ("dictionary<values=string, indices=int32>", "dictionary<values=string, indices=int32>"),
    ],
)
def test_arrow_type_names_and_aliases_are_normalised(written: str, stored: str) -> None:
    assert arrow_type_name(written) == stored


@pytest.mark.parametrize(
    "name", ["list<int64>", "int", "Int64", "timestamp[m]", "decimal128(10,2)", "double "]
)
def test_other_type_names_are_rejected(name: str) -> None:
    with pytest.raises(
        ValueError, match=rf"^unknown Arrow type {re.escape(repr(name))}; use e.g. int64, double"
    ):
        arrow_type_name(name)


def test_the_contract_stores_normalised_types_and_locates_unknown_ones() -> None:
    assert SchemaContract(columns={"amount": "float64", "country": "utf8"}).columns == {
        "amount": "double",
        "country": "string",
    }
    with pytest.raises(ValidationError) as caught:
        SchemaContract(columns={"amount": "double", "hour": "integer"})
    assert [e["loc"] for e in caught.value.errors()] == [("columns", "hour")]


def test_the_volume_rule_needs_one_row_and_no_change_limit_by_default() -> None:
    assert (VolumeRule().min_rows, VolumeRule().max_change) == (1, None)
    assert VolumeRule(min_rows=0).min_rows == 0
    with pytest.raises(ValidationError, match="greater than 0"):
        VolumeRule(max_change=0)


def test_drift_defaults_to_psi_against_the_previous_snapshot() -> None:
    drift = DriftRule()
    assert (drift.numeric_method, drift.categorical_method, drift.threshold, drift.reference) == (
        "psi",
        "psi",
        0.2,
        "previous",
    )


@pytest.mark.parametrize(("field", "value"), [("threshold", 0), ("feature_thresholds", {"amount": -0.1})])
def test_drift_thresholds_are_positive(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match="Input should be greater than 0"):
        DriftRule.model_validate({field: value})


def test_the_categorical_drift_score_is_psi_or_chi2() -> None:
    assert DriftRule(categorical_method="chi2").categorical_method == "chi2"
    with pytest.raises(ValidationError, match="Input should be 'psi' or 'chi2'"):
        DriftRule.model_validate({"categorical_method": "ks"})


def test_validation_defaults_check_volume_only_and_stop_on_errors() -> None:
    section = ValidationSection()
    assert section.contract == SchemaContract() and section.expectations == []
    assert (section.drift, section.fail_on, section.batch_rows) == (None, "error", 524_288)


def test_the_contract_is_written_schema_in_the_config() -> None:
    section = ValidationSection.model_validate({"schema": {"columns": {"id": "string"}}, "fail_on": "never"})
    assert (section.contract.columns, section.fail_on) == ({"id": "string"}, "never")
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ValidationSection.model_validate({"contract": {}})


def test_expectation_problems_are_located_by_index() -> None:
    rules = [{"type": BETWEEN, "kwargs": {"column": "a"}}, {"type": "expect_column_to_exist"}]
    with pytest.raises(ValidationError) as caught:
        ValidationSection.model_validate({"expectations": rules})
    [error] = caught.value.errors()
    assert error["loc"] == ("expectations", 1)
    assert error["ctx"]["problems"] == [(("kwargs",), "expect_column_to_exist needs column")]


@pytest.mark.parametrize(
    ("engine", "expectation", "runs_on"),
    [
        ("sql", "expect_column_values_to_be_increasing", "it runs on engine 'stream'"),
        ("sql", "expect_column_values_to_match_strftime_format", "it runs on engine 'stream', 'spark'"),
        ("stream", "expect_column_values_to_match_like_pattern", "it runs on engine 'sql'"),
        ("spark", "expect_column_values_to_match_like_pattern", "it runs on engine 'sql'"),
        ("spark", "expect_column_values_to_be_dateutil_parseable", "it runs on engine 'stream'"),
        ("spark", "expect_column_values_to_be_increasing", "it runs on engine 'stream'"),
    ],
)
def test_an_expectation_the_engine_cannot_run_is_rejected(
    engine: str, expectation: str, runs_on: str
) -> None:
    required = {"column": "a", "strftime_format": "%Y", "like_pattern": "a%"}
    kwargs = {k: v for k, v in required.items() if k in EXPECTATIONS[expectation][0]}
    rules = [
        {"type": BETWEEN, "kwargs": {"column": "a", "min_value": 0}},
        {"type": expectation, "kwargs": kwargs},
    ]
    with pytest.raises(ValidationError) as caught:
        ValidationSection.model_validate({"engine": engine, "expectations": rules})
    [error] = caught.value.errors()
    [(loc, message)] = error["ctx"]["problems"]
    assert loc == ("expectations", 1, "type")
    assert message.startswith(f"{expectation} cannot run on validation.engine {engine!r}")
    assert message.endswith(runs_on)


def test_spark_refuses_an_order_it_does_not_have_and_a_token_in_the_config() -> None:
    increasing = {"type": "expect_column_values_to_be_increasing", "kwargs": {"column": "a"}}
    with pytest.raises(ValidationError) as caught:
        ValidationSection.model_validate({"engine": "spark", "expectations": [increasing]})
    [(_, message)] = caught.value.errors()[0]["ctx"]["problems"]
    assert "rows have no defined order on engine 'spark'" in message
    section = ValidationSection.model_validate({"engine": "spark", "spark_remote": "sc://spark:15002/"})
    assert section.spark_remote == "sc://spark:15002"
    for remote, why in [
        ("sc://spark:15002/;token=abc", "SPARK_REMOTE environment variable"),
        ("spark:15002", "expected a Spark Connect address sc://HOST:PORT"),
    ]:
        with pytest.raises(ValidationError, match=why):
            ValidationSection.model_validate({"engine": "spark", "spark_remote": remote})


def test_the_sql_engine_runs_the_usual_expectations() -> None:
    rules = [
        {"type": BETWEEN, "kwargs": {"column": "a", "min_value": 0}},
        {"type": "expect_column_values_to_not_be_null", "kwargs": {"column": "a"}},
        {
            "type": "expect_column_quantile_values_to_be_between",
            "kwargs": {"column": "a", "quantile_ranges": {}},
        },
        {"type": "expect_column_values_to_be_unique", "kwargs": {"column": "a"}},
    ]
    assert ValidationSection.model_validate({"engine": "sql", "expectations": rules}).engine == "sql"
