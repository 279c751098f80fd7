"""config.evaluation: the threshold of the class metrics, as a number or a rule, located errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_trainpipe.config import load_config, parse_config
from airflow_trainpipe.config.evaluation import EvaluationSection, PrecisionAt
from airflow_trainpipe.core.exceptions import ConfigError

EXAMPLES = Path(__file__).parents[2] / "dags" / "configs"
FORMS = "expected a number in [0, 1], 'max_f1', or {precision_at: p} with 0 < p <= 1"


def _with_threshold(example: str, value: str) -> str:
    text = (EXAMPLES / example).read_text()
    text = text.replace("evaluation:\n  threshold: max_f1", "evaluation:\n  threshold: 0.5")
    if "evaluation:" not in text:
        text = text.replace("\ngate:\n", "\nevaluation:\n  threshold: 0.5\n\ngate:\n", 1)
    return text.replace("evaluation:\n  threshold: 0.5", f"evaluation:\n  threshold: {value}", 1)


def test_the_default_threshold_is_one_half() -> None:
    assert EvaluationSection().threshold == 0.5


@pytest.mark.parametrize(
    ("written", "parsed"),
    [
        ("0.3", 0.3),
        ("1", 1.0),
        ("0", 0.0),
        ("max_f1", "max_f1"),
        ("{precision_at: 0.9}", PrecisionAt(precision_at=0.9)),
    ],
)
def test_a_threshold_is_a_number_max_f1_or_a_precision_floor(written: str, parsed: Any) -> None:
    assert parse_config(_with_threshold("fraud_detector.yaml", written)).evaluation.threshold == parsed


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("maxf1", f"{FORMS}, got 'maxf1'"),
        ("1.2", f"{FORMS}, got 1.2"),
        ("true", f"{FORMS}, got True"),
        ("{recall_at: 0.5}", f"{FORMS}, got {{'recall_at': 0.5}}"),
        ("{precision_at: 0}", "precision_at is a precision, 0 < p <= 1, got 0"),
        ("{precision_at: high}", "precision_at is a precision, 0 < p <= 1, got 'high'"),
    ],
)
def test_a_bad_threshold_is_named_with_its_line_and_the_forms_it_may_take(
    tmp_path: Path, written: str, message: str
) -> None:
    config = tmp_path / "fraud.yaml"
    config.write_text(_with_threshold("fraud_detector.yaml", written))
    line = next(
        i for i, text in enumerate(config.read_text().splitlines(), 1) if text.startswith("  threshold:")
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert f"fraud.yaml:{line}:" in str(caught.value)
    assert f"evaluation.threshold: {message}" in str(caught.value)


def test_a_regression_pipeline_has_no_threshold_to_choose() -> None:
    with pytest.raises(
        ConfigError, match=r"evaluation\.threshold: a regression model predicts values, not classes"
    ):
        parse_config(_with_threshold("house_prices.yaml", "max_f1"))
    assert parse_config(_with_threshold("house_prices.yaml", "0.5")).evaluation.threshold == 0.5


def _with_slices(slices: str, gate_extra: str = "") -> str:
    text = _with_threshold("fraud_detector.yaml", "max_f1").replace(
        "evaluation:\n  threshold: max_f1", f"evaluation:\n  threshold: max_f1\n  slices: {slices}", 1
    )
    return text.replace("  min_improvement: 0.001", f"  min_improvement: 0.001{gate_extra}", 1)


def test_slices_are_feature_columns_categorical_by_value_numeric_by_bins() -> None:
    config = parse_config(
        _with_slices(
            "[{column: channel}, {column: amount, bins: [10, 100]}]",
            "\n  slice_guardrail: {max_regression: 0.02}",
        )
    )
    assert [(s.column, s.bins) for s in config.evaluation.slices] == [
        ("channel", None),
        ("amount", [10.0, 100.0]),
    ]
    assert config.gate.slice_guardrail is not None and config.gate.slice_guardrail.min_rows == 100


@pytest.mark.parametrize(
    ("slices", "message"),
    [
        (
            "[{column: amount}]",
            "evaluation.slices[0].bins: numeric column 'amount' is sliced by bins: give edges",
        ),
        (
            "[{column: channel, bins: [1]}]",
            "evaluation.slices[0].bins: categorical column 'channel' is sliced by value",
        ),
        (
            "[{column: chanel}]",
            "evaluation.slices[0].column: 'chanel' is not a feature column (did you mean 'channel'?)",
        ),
        (
            "[{column: amount, bins: [10, 10]}]",
            "evaluation.slices[0].bins: bins are strictly ascending edges",
        ),
    ],
)
def test_a_bad_slice_is_named_by_its_index(slices: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_with_slices(slices))
    assert message in str(caught.value)


def test_a_slice_guardrail_needs_slices_and_a_metric_of_the_task() -> None:
    with pytest.raises(ConfigError, match=r"gate\.slice_guardrail: there are no evaluation\.slices to guard"):
        parse_config(_with_slices("[]", "\n  slice_guardrail: {}"))
    with pytest.raises(
        ConfigError, match=r"gate\.slice_guardrail\.metric: 'rmse' is not a binary_classification"
    ):
        parse_config(_with_slices("[{column: channel}]", "\n  slice_guardrail: {metric: rmse}"))
