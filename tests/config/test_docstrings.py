"""config.docstrings: field descriptions read from the attribute docstrings of the models' source."""

from __future__ import annotations

from pydantic import BaseModel

from airflow_trainpipe.config.data import WaitSection
from airflow_trainpipe.config.docstrings import field_description, field_descriptions
from airflow_trainpipe.config.gate import GateSection


class _Parent(BaseModel):
    name: str
    """The parent's name."""

    size: int = 1
    """Size,
        indented on its second line."""

    undocumented: int = 0

    def method(self) -> int:
        return self.size

    """A string after a method."""


class _Child(_Parent):
    size: int = 2
    """The child's own size."""

    extra: str = ""
    # a comment, not a docstring
    """Follows a comment, still the next statement."""


def test_the_string_after_an_annotation_is_its_description() -> None:
    assert field_description(GateSection, "metric") == "Primary metric, e.g. `roc_auc` or `rmse`."


def test_a_multi_line_description_is_dedented() -> None:
    assert field_description(WaitSection, "mode") == (
        "`deferrable` waits in the triggerer (no worker slot); `reschedule` frees the slot between checks;\n"
        "`poke` holds a worker slot."
    )
    assert field_description(_Parent, "size") == "Size,\nindented on its second line."


def test_fields_without_a_docstring_have_no_description() -> None:
    assert "undocumented" not in field_descriptions(_Parent)
    assert set(field_descriptions(_Parent)) == {"name", "size"}
    assert field_description(_Parent, "undocumented") is None
    assert field_description(_Parent, "no_such_field") is None


def test_inherited_descriptions_are_included_and_overridden_by_the_subclass() -> None:
    assert field_descriptions(_Child) == {
        "name": "The parent's name.",
        "size": "The child's own size.",
        "extra": "Follows a comment, still the next statement.",
    }
    assert field_descriptions(_Parent)["size"] == "Size,\nindented on its second line."


def test_a_model_without_source_has_no_descriptions() -> None:
    made = type("Made", (BaseModel,), {"__annotations__": {"x": int}, "__module__": "nowhere"})
    assert field_descriptions(made) == {}


def test_a_model_without_source_still_gets_its_parents_descriptions() -> None:
    made = type("Made", (_Parent,), {"__module__": "nowhere"})
    assert field_descriptions(made)["name"] == "The parent's name."


def test_descriptions_are_read_once_per_model() -> None:
    assert field_descriptions(GateSection) is field_descriptions(GateSection)
