"""config.register: the registry target, its aliases and their validation."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from airflow_trainpipe.config.register import RegisterSection


def _errors(**data: Any) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        RegisterSection.model_validate(data)
    return [(e["loc"], e["msg"]) for e in caught.value.errors(include_url=False)]


def test_defaults_promote_to_champion_and_keep_the_previous_one() -> None:
    section = RegisterSection()
    assert (section.model_name, section.alias, section.previous_alias) == (
        None,
        "champion",
        "previous_champion",
    )
    assert section.tags == {}


def test_the_previous_alias_can_be_dropped() -> None:
    assert RegisterSection.model_validate({"previous_alias": None}).previous_alias is None


def test_the_two_aliases_must_differ() -> None:
    with pytest.raises(ValidationError) as caught:
        RegisterSection.model_validate({"alias": "prod", "previous_alias": "prod"})
    [error] = caught.value.errors()
    assert error["type"] == "cross_field"
    assert error["ctx"]["problems"] == [(("previous_alias",), "must differ from alias 'prod'")]


def test_aliases_differing_in_case_are_distinct() -> None:
    section = RegisterSection.model_validate({"alias": "Prod", "previous_alias": "prod"})
    assert (section.alias, section.previous_alias) == ("Prod", "prod")


@pytest.mark.parametrize("name", ["fraud", "fraud.v2-eu_1", "0model", "a" * 256])
def test_registered_model_names_follow_mlflows_characters(name: str) -> None:
    assert RegisterSection(model_name=name).model_name == name


@pytest.mark.parametrize("name", ["", "-fraud", ".hidden", "fraud detector", "a/b", "a" * 257])
def test_other_model_names_are_rejected(name: str) -> None:
    [(loc, message)] = _errors(model_name=name)
    assert loc == ("model_name",) and message.startswith("String should match pattern")


@pytest.mark.parametrize(
    ("field", "alias", "reason"),
    [
        ("alias", "latest", "reserved by MLflow"),
        ("previous_alias", "v3", "reserved by MLflow"),
        ("alias", "prod champion", "letters, digits, '_' and '-' only"),
    ],
)
def test_aliases_mlflow_refuses_are_rejected(field: str, alias: str, reason: str) -> None:
    [(loc, message)] = _errors(**{field: alias})
    assert loc == (field,) and reason in message


def test_tag_values_are_strings() -> None:
    assert _errors(tags={"team": 7}) == [(("tags", "team"), "Input should be a valid string")]
    assert RegisterSection(tags={"team": "risk"}).tags == {"team": "risk"}


def test_approval_is_off_by_default_and_stages_under_challenger_when_on() -> None:
    assert RegisterSection().approval == "none"
    section = RegisterSection.model_validate({"approval": "required", "approval_timeout": "2h"})
    assert (section.staging_alias, section.approval_timeout, section.on_approval_timeout) == (
        "challenger",
        timedelta(hours=2),
        "reject",
    )


def test_the_staging_alias_must_not_be_a_serving_alias() -> None:
    with pytest.raises(ValidationError) as caught:
        RegisterSection.model_validate({"approval": "required", "staging_alias": "previous_champion"})
    [error] = caught.value.errors()
    assert error["ctx"]["problems"] == [
        (("staging_alias",), "must differ from alias 'champion' and previous_alias")
    ]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("approval", "maybe", "Input should be 'none' or 'required'"),
        ("on_approval_timeout", "ignore", "Input should be 'reject', 'approve' or 'fail'"),
        ("approval_timeout", "0s", "expected a duration greater than zero"),
    ],
)
def test_approval_settings_name_what_they_accept(field: str, value: str, expected: str) -> None:
    [(loc, message)] = _errors(**{field: value})
    assert loc[0] == field and expected in message
