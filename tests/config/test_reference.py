"""The config reference in docs/configuration.md and `trainpipe schema` come from the models themselves."""

from __future__ import annotations

import json

from jsonschema import Draft202012Validator
from pydantic import BaseModel

from airflow_trainpipe.config.docstrings import field_description
from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.config.reference import BEGIN_MARKER, END_MARKER, json_schema, markdown_reference
from tests.conftest import REPO_ROOT


def _all_sections(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    from airflow_trainpipe.config.reference import section_models_in

    seen.add(model)
    for info in model.model_fields.values():
        for sub in section_models_in(info.annotation):
            if sub not in seen:
                _all_sections(sub, seen)
    return seen


def test_every_field_is_documented() -> None:
    undocumented = [
        f"{model.__name__}.{name}"
        for model in _all_sections(PipelineConfig, set())
        for name in model.model_fields
        if not field_description(model, name)
    ]
    assert undocumented == []


def test_descriptions_are_read_from_the_attribute_docstrings() -> None:
    from airflow_trainpipe.config.training import Hyperparameters

    assert field_description(Hyperparameters, "learning_rate") == "AdamW learning rate."
    assert (
        json_schema()["$defs"]["Hyperparameters"]["properties"]["learning_rate"]["description"]
        == "AdamW learning rate."
    )
    # Inherited fields and aliased keys keep theirs.
    assert json_schema()["properties"]["register"]["description"]


def test_readme_reference_is_up_to_date() -> None:
    readme = (REPO_ROOT / "docs" / "configuration.md").read_text()
    start, end = readme.index(BEGIN_MARKER), readme.index(END_MARKER) + len(END_MARKER)
    assert readme[start:end] + "\n" == markdown_reference(), (
        "run `make docs` to regenerate the reference in docs/configuration.md"
    )


def test_json_schema_is_valid_and_uses_yaml_keys() -> None:
    schema = json_schema()
    Draft202012Validator.check_schema(schema)
    assert "register" in schema["properties"] and "registration" not in schema["properties"]
    text = json.dumps(schema)
    assert '"async"' in text and "async_upload" not in text
