"""config.gate: the gate section, its guardrails and the bootstrap policy, with their defaults and limits."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from airflow_trainpipe.config.gate import GateSection, Guardrail, NoChampionPolicy


def _first_error(model: type[BaseModel], data: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    with pytest.raises(ValidationError) as caught:
        model.model_validate(data)
    error = caught.value.errors()[0]
    return tuple(error["loc"]), error["msg"]


def test_a_gate_needs_only_its_metric() -> None:
    gate = GateSection(metric="roc_auc")
    assert (gate.direction, gate.min_improvement, gate.min_relative_improvement) == (None, 0.0, 0.0)
    assert gate.guardrails == []
    assert gate.no_champion == NoChampionPolicy(action="promote", min_value=None)


def test_a_gate_without_a_metric_is_incomplete() -> None:
    assert _first_error(GateSection, {}) == (("metric",), "Field required")


@pytest.mark.parametrize("field", ["min_improvement", "min_relative_improvement"])
def test_improvement_minimums_cannot_be_negative(field: str) -> None:
    assert _first_error(GateSection, {"metric": "rmse", field: -0.001}) == (
        (field,),
        "Input should be greater than or equal to 0",
    )


def test_a_direction_is_maximize_or_minimize() -> None:
    loc, message = _first_error(GateSection, {"metric": "rmse", "direction": "lower"})
    assert loc == ("direction",) and message == "Input should be 'maximize' or 'minimize'"
    assert GateSection(metric="rmse", direction="minimize").direction == "minimize"


def test_guardrails_default_to_no_regression_at_all() -> None:
    guardrail = Guardrail(metric="log_loss")
    assert (guardrail.max_regression, guardrail.max_relative_regression) == (0.0, None)


@pytest.mark.parametrize("field", ["max_regression", "max_relative_regression"])
def test_a_guardrail_limit_cannot_be_negative(field: str) -> None:
    loc, _message = _first_error(Guardrail, {"metric": "recall", field: -0.1})
    assert loc == (field,)


def test_guardrail_problems_are_located_by_index() -> None:
    data = {
        "metric": "roc_auc",
        "guardrails": [{"metric": "recall"}, {"metric": "f1", "max_regression": "a"}],
    }
    loc, _message = _first_error(GateSection, data)
    assert loc == ("guardrails", 1, "max_regression")


@pytest.mark.parametrize("action", ["promote", "skip", "fail"])
def test_the_first_run_may_promote_skip_or_fail(action: str) -> None:
    assert NoChampionPolicy.model_validate({"action": action}).action == action


def test_an_unknown_bootstrap_action_lists_the_choices() -> None:
    assert _first_error(NoChampionPolicy, {"action": "register"}) == (
        ("action",),
        "Input should be 'promote', 'skip' or 'fail'",
    )


def test_the_bootstrap_minimum_may_be_any_number() -> None:
    assert NoChampionPolicy(min_value=-1.5).min_value == -1.5  # e.g. an r2 floor below zero


def test_limits_are_numbers_not_quoted_numbers() -> None:
    assert _first_error(GateSection, {"metric": "rmse", "min_improvement": "0.1"}) == (
        ("min_improvement",),
        "Input should be a valid number",
    )


def test_confidence_is_a_level_above_one_half_with_a_seeded_resample_count() -> None:
    gate = GateSection(metric="roc_auc", confidence=0.95)
    assert (gate.confidence, gate.bootstrap_samples, gate.bootstrap_seed) == (0.95, 1000, 0)
    assert GateSection(metric="roc_auc").confidence is None
    for level in (0.5, 1.0, 95):
        loc, _ = _first_error(GateSection, {"metric": "roc_auc", "confidence": level})
        assert loc == ("confidence",)
    assert _first_error(GateSection, {"metric": "roc_auc", "bootstrap_samples": 10}) == (
        ("bootstrap_samples",),
        "Input should be greater than or equal to 100",
    )
