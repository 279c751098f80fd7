"""Base class of every config section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError


class Section(BaseModel):
    """A config section: strict types, unknown keys rejected, immutable once parsed.

    Field docstrings become the descriptions in `trainpipe schema`, docs/configuration.md and
    error messages (read on demand by `config.docstrings`, not at import: parse time).
    """

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        strict=True,
        validate_default=True,
    )


FieldProblems = list[tuple[tuple[str | int, ...], str]]
"""Cross-field problems of one model: (location of the field, what is wrong with it)."""


def field_problems(problems: FieldProblems) -> None:
    """Raise cross-field problems so each keeps the location of the field it is about.

    A model validator can only fail as a whole; the loader unpacks `ctx["problems"]` into one
    located message per field, so `gate.metric` is reported on the line of `gate.metric`.
    """
    if problems:
        raise PydanticCustomError(
            "cross_field",
            "; ".join(f"{'.'.join(map(str, loc))}: {msg}" for loc, msg in problems),
            {"problems": problems},
        )
