"""`register`: how a promoted candidate enters the MLflow model registry."""

from __future__ import annotations

from pydantic import Field, model_validator

from airflow_trainpipe.config.base import Section, field_problems
from airflow_trainpipe.config.types import Alias


class RegisterSection(Section):
    """MLflow registry target; promotion moves aliases, never the deprecated stages."""

    model_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,255}$")
    """Registered model name; defaults to the pipeline name."""

    alias: Alias = "champion"
    """Alias set on the promoted version; the gate compares against the version holding it."""

    previous_alias: Alias | None = "previous_champion"
    """Alias moved to the replaced champion so it stays reachable for rollback; null to drop it."""

    tags: dict[str, str] = {}
    """Extra tags on every registered version (lineage tags are always added)."""

    @model_validator(mode="after")
    def _distinct_aliases(self) -> RegisterSection:
        if self.previous_alias == self.alias:
            field_problems([(("previous_alias",), f"must differ from alias {self.alias!r}")])
        return self
