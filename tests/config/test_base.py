"""config.base: the strict, closed, frozen `Section` and located cross-field problems."""

from __future__ import annotations

import pytest
from pydantic import ValidationError, model_validator
from pydantic_core import PydanticCustomError

from airflow_trainpipe.config.base import Section, field_problems


class _Limits(Section):
    low: int = 0
    high: int = 10

    @model_validator(mode="after")
    def _ordered(self) -> _Limits:
        if self.low > self.high:
            field_problems([(("high",), f"must be at least low {self.low}")])
        return self


def _only_error(data: dict[str, object]) -> dict[str, object]:
    with pytest.raises(ValidationError) as caught:
        _Limits.model_validate(data)
    [error] = caught.value.errors(include_url=False)
    return dict(error)


def test_unknown_keys_are_rejected() -> None:
    error = _only_error({"low": 1, "hihg": 2})
    assert (error["type"], error["loc"]) == ("extra_forbidden", ("hihg",))


def test_types_are_strict_so_a_quoted_number_is_not_an_int() -> None:
    error = _only_error({"low": "1"})
    assert (error["type"], error["loc"], error["input"]) == ("int_type", ("low",), "1")


def test_a_parsed_section_cannot_be_changed() -> None:
    limits = _Limits(low=1)
    with pytest.raises(ValidationError, match="frozen"):
        limits.low = 5  # type: ignore[misc]
    assert limits.low == 1


def test_defaults_are_validated_too() -> None:
    class BadDefault(Section):
        count: int = "three"  # type: ignore[assignment]

    with pytest.raises(ValidationError, match="Input should be a valid integer"):
        BadDefault()


def test_a_cross_field_problem_keeps_the_location_of_its_field() -> None:
    error = _only_error({"low": 11, "high": 3})
    assert error["type"] == "cross_field"
    assert error["loc"] == ()
    assert error["ctx"] == {"problems": [(("high",), "must be at least low 11")]}
    assert error["msg"] == "high: must be at least low 11"


def test_no_problems_raise_nothing() -> None:
    assert field_problems([]) is None


def test_several_problems_form_one_error_with_dotted_locations() -> None:
    problems: list[tuple[tuple[str | int, ...], str]] = [
        (("guardrails", 0, "metric"), "unknown"),
        (("direction",), "contrary"),
    ]
    with pytest.raises(PydanticCustomError) as caught:
        field_problems(problems)
    assert caught.value.type == "cross_field"
    assert str(caught.value) == "guardrails.0.metric: unknown; direction: contrary"
    assert caught.value.context == {"problems": problems}
