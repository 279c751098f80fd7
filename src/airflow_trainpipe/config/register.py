"""`register`: how a promoted candidate enters the MLflow model registry."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.types import Alias, PositiveDuration


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

    approval: Literal["none", "required"] = "none"
    """`required`: the gate's winner is registered under `staging_alias` and waits for a person in
    the Airflow UI's Required Actions (or the HITL REST API); Approve moves `alias` (and
    `previous_alias`), Reject records who and why on the version. `none`: the gate decides alone."""

    staging_alias: Alias = "challenger"
    """With approval: the alias a version awaiting approval holds (removed again on reject)."""

    approval_timeout: PositiveDuration = timedelta(days=3)
    """With approval: how long the request waits for an answer."""

    on_approval_timeout: Literal["reject", "approve", "fail"] = "reject"
    """With approval, when nobody answered in time: `reject` (the version stays unpromoted, tagged as
    timed out), `approve` (promoted as if approved), or `fail` (the approval task fails, not retried:
    a retry would ask again past the deadline)."""

    approvers: list[str] = []
    """With approval: Airflow user ids allowed to answer; empty: anyone who may edit the DAG's runs."""

    @model_validator(mode="after")
    def _distinct_aliases(self) -> RegisterSection:
        problems: FieldProblems = []
        if self.previous_alias == self.alias:
            problems.append((("previous_alias",), f"must differ from alias {self.alias!r}"))
        if self.approval == "required" and self.staging_alias in (self.alias, self.previous_alias):
            problems.append((("staging_alias",), f"must differ from alias {self.alias!r} and previous_alias"))
        field_problems(problems)
        return self
