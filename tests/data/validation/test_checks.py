"""Schema contract and volume checks, judged from column types and row counts alone."""

from __future__ import annotations

import re

import pytest

from airflow_trainpipe.config import PipelineConfig, parse_config
from airflow_trainpipe.contracts.payloads import Check
from airflow_trainpipe.data.validation.checks import required_columns, schema_checks, volume_checks
from tests.conftest import EXAMPLE_CONFIGS

# The fraud example's own contract: ten columns, no extras allowed.
CONTRACT = {
    "transaction_id": "string",
    "amount": "double",
    "hour": "int64",
    "merchant_risk": "double",
    "distance_from_home_km": "double",
    "account_age_days": "int64",
    "txn_count_24h": "int64",
    "channel": "string",
    "country": "string",
    "is_fraud": "int64",
}
# What the model uses when there is no contract: label, features, then the holdout key.
MODEL_COLUMNS = [
    "is_fraud",
    "amount",
    "hour",
    "merchant_risk",
    "distance_from_home_km",
    "account_age_days",
    "txn_count_24h",
    "channel",
    "country",
    "transaction_id",
]


def _config(validation: str | None = None) -> PipelineConfig:
    """The fraud example, with its `validation` section replaced when `validation` is given."""
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    if validation is not None:
        text = re.sub(r"(?ms)^validation:\n.*?(?=^training:)", f"validation:\n{validation}\n", text)
    return parse_config(text)


@pytest.fixture(scope="module")
def contract_config() -> PipelineConfig:
    return _config()


@pytest.fixture(scope="module")
def free_config() -> PipelineConfig:
    return _config("  volume: {min_rows: 1}\n")


def _volume(min_rows: int, max_change: float | None) -> PipelineConfig:
    rule = f"{{min_rows: {min_rows}" + (f", max_change: {max_change}}}" if max_change else "}")
    return _config(f"  volume: {rule}\n")


def _verdicts(checks: list[Check]) -> list[tuple[str, str | None, bool]]:
    return [(c.name, c.column, c.passed) for c in checks]


def test_a_declared_contract_is_the_required_columns(contract_config: PipelineConfig) -> None:
    assert required_columns(contract_config, {"columns": {"other": "string"}}) == CONTRACT


def test_without_a_contract_the_model_columns_are_required_typed_like_the_reference(
    free_config: PipelineConfig,
) -> None:
    reference = {"columns": {"amount": "double", "channel": "string", "unused": "bool"}}
    required = required_columns(free_config, reference)
    assert list(required) == MODEL_COLUMNS
    assert required["amount"] == "double" and required["channel"] == "string"
    assert required["hour"] is None and "unused" not in required
    assert set(required_columns(free_config, None).values()) == {None}


def test_a_snapshot_matching_the_contract_gets_one_passing_check(contract_config: PipelineConfig) -> None:
    (check,) = schema_checks(contract_config, dict(CONTRACT), None)
    assert (check.kind, check.name, check.column, check.passed) == ("schema", "contract", None, True)
    assert (check.observed, check.expected) == (10, 10)
    assert check.message == "10 required column(s) present with the expected types"


def test_a_renamed_column_is_missing_with_a_hint_and_its_new_name_is_unexpected(
    contract_config: PipelineConfig,
) -> None:
    columns = {("amt" if name == "amount" else name): kind for name, kind in CONTRACT.items()}
    missing, unexpected = schema_checks(contract_config, columns, None)
    assert _verdicts([missing, unexpected]) == [
        ("column present", "amount", False),
        ("unexpected column", "amt", False),
    ]
    assert missing.message == "column 'amount' is missing; new column(s) 'amt': renamed?"
    assert (missing.observed, missing.expected) == ("missing", "double")
    assert (unexpected.observed, unexpected.expected) == ("double", "absent")
    assert "allow_extra_columns" in unexpected.message


def test_a_dropped_column_has_no_rename_hint(contract_config: PipelineConfig) -> None:
    columns = {name: kind for name, kind in CONTRACT.items() if name != "country"}
    (check,) = schema_checks(contract_config, columns, None)
    assert check.message == "column 'country' is missing"


def test_a_retyped_column_names_both_types(contract_config: PipelineConfig) -> None:
    (check,) = schema_checks(contract_config, {**CONTRACT, "hour": "string"}, None)
    assert _verdicts([check]) == [("column type", "hour", False)]
    assert (check.observed, check.expected) == ("string", "int64")
    assert check.message == "column 'hour' is string, expected int64"


def test_extra_columns_pass_when_the_contract_allows_them() -> None:
    contract = "".join(f"      {name}: {kind}\n" for name, kind in CONTRACT.items())
    config = _config(f"  schema:\n    allow_extra_columns: true\n    columns:\n{contract}")
    (check,) = schema_checks(config, {**CONTRACT, "note": "string"}, None)
    assert check.passed and (check.observed, check.expected) == (11, 10)


def test_without_a_reference_any_types_and_extra_columns_pass(free_config: PipelineConfig) -> None:
    columns = dict.fromkeys([*MODEL_COLUMNS, "note"], "string")
    (check,) = schema_checks(free_config, columns, None)
    assert check.passed and check.expected == len(MODEL_COLUMNS)


def test_without_a_contract_the_reference_decides_types_and_extras(free_config: PipelineConfig) -> None:
    reference = {"columns": dict.fromkeys(MODEL_COLUMNS, "int64")}
    columns = {**reference["columns"], "merchant_risk": "double", "note": "string"}
    checks = schema_checks(free_config, columns, reference)
    assert _verdicts(checks) == [
        ("column type", "merchant_risk", False),
        ("unexpected column", "note", False),
    ]


@pytest.mark.parametrize(("rows", "passed"), [(999, False), (1000, True), (1001, True)])
def test_min_rows_is_inclusive(rows: int, passed: bool) -> None:
    (check,) = volume_checks(_volume(1000, None), rows, {"rows": 1, "partition": "ds=2026-01-01"})
    assert (check.name, check.passed, check.observed, check.expected) == ("min_rows", passed, rows, ">= 1000")
    assert check.message == f"{rows} row(s); at least 1000 expected"


def test_the_first_snapshot_passes_the_change_rule_for_lack_of_a_previous_one() -> None:
    _, change = volume_checks(_volume(1, 0.5), 7, None)
    assert (change.name, change.passed, change.observed, change.expected) == ("max_change", True, 7, None)
    assert "no previous validated snapshot" in change.message


@pytest.mark.parametrize(
    ("rows", "observed", "passed"),
    [(1500, 0.5, True), (1501, 0.501, False), (500, -0.5, True), (499, -0.501, False), (1000, 0.0, True)],
)
def test_the_row_count_may_change_by_max_change_either_way(rows: int, observed: float, passed: bool) -> None:
    previous = {"rows": 1000, "partition": "ds=2026-01-01"}
    _, change = volume_checks(_volume(1, 0.5), rows, previous)
    assert (change.passed, change.observed, change.expected) == (passed, observed, "+/-0.5")


def test_the_change_message_names_the_previous_partition_and_the_percentage() -> None:
    previous = {"rows": 800, "partition": "ds=2026-01-01"}
    _, change = volume_checks(_volume(1, 0.25), 1100, previous)
    assert change.observed == 0.375 and not change.passed
    assert change.message == "1100 row(s) vs 800 in ds=2026-01-01 (+37.5%); allowed +/-25%"


def test_rows_after_an_empty_previous_snapshot_are_an_infinite_change() -> None:
    _, change = volume_checks(_volume(0, 0.5), 10, {"rows": 0, "partition": "ds=2026-01-01"})
    assert change.observed == float("inf") and not change.passed


def test_a_check_serializes_every_field() -> None:
    check = Check("volume", "min_rows", None, False, 3, ">= 5", "3 row(s)")
    assert check.to_dict() == {
        "kind": "volume",
        "name": "min_rows",
        "column": None,
        "passed": False,
        "observed": 3,
        "expected": ">= 5",
        "message": "3 row(s)",
    }
