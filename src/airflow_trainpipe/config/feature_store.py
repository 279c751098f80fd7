"""`data.feature_store`: model inputs joined from a Feast feature store, as of each row's time.

The entity rows (keys, event time, label) come from `data.source`, any kind; Feast's
`get_historical_features` adds each feature's value as of the row's event time (never a value
from after it), and the joined rows are frozen as the run's snapshot, then validated and trained
on as any other. Feast runs in its own interpreter (`python`): it pins pandas < 3 and is never
imported by an Airflow worker or at parse time.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.types import ColumnName

ACCEPT_CHANGES_PARAM = "accept_feature_changes"
"""The trigger form's Param that accepts changed feature-view definitions for one run."""

FeatureReference = str
"""`view:feature`, as Feast writes it."""


class FeatureStoreSection(Section):
    """A Feast feature repo the run's features are retrieved from (DuckDB offline store: it
    returns a null for a row with no value inside the view's TTL, where Feast's file store drops
    the row and its label)."""

    repo: str = Field(min_length=1)
    """The feature repo's folder (it holds `feature_store.yaml`): an absolute path, or one
    relative to TRAINPIPE_HOME. Its registry, online and offline stores are whatever that file
    names (a local SQLite online store here, the team's stores in production)."""

    features: list[FeatureReference] | None = Field(default=None, min_length=1)
    """Feature references, `view:feature`, each added to the rows as a column named after the
    feature (`view__feature` with `full_feature_names`). Give these or `feature_service`."""

    feature_service: str | None = Field(default=None, min_length=1)
    """A Feast feature service naming the features instead of `features`."""

    timestamp_column: ColumnName
    """The entity rows' event time: each feature is joined as of it (values from after it are
    never used; none within the view's TTL before it gives a null). A timestamp without a time
    zone counts as UTC."""

    full_feature_names: bool = False
    """Name the added columns `view__feature` (two views with a feature of the same name need it)."""

    materialize: bool = True
    """When a model is promoted (or approved), load the feature views it was trained on into the
    online store first, so serving reads what training read. The first load of a view covers the
    training data's time back by the view's TTL (Feast's own first incremental load covers only
    `now - ttl`); later ones continue from where the last stopped."""

    python: str | None = None
    """The interpreter that runs Feast (`feast[duckdb]` installed, see constraints-feast.txt);
    null: `$TRAINPIPE_FEAST_PYTHON` (`make venv` builds `.venv-feast` and sets it)."""

    @model_validator(mode="after")
    def _one_feature_list(self) -> FeatureStoreSection:
        problems: FieldProblems = []
        if (self.features is None) == (self.feature_service is None):
            problems.append(
                (("features",), "give either features (view:feature references) or feature_service, not both")
            )
        for index, reference in enumerate(self.features or []):
            view, sep, feature = reference.partition(":")
            if (
                not (sep and view.strip() and feature.strip())
                or ":" in feature
                or reference != reference.strip()
            ):
                problems.append(
                    (("features", index), f"expected a Feast reference view:feature, got {reference!r}")
                )
        if self.features is not None and len(set(self.features)) != len(self.features):
            repeated = sorted({f for f in self.features if self.features.count(f) > 1})
            problems.append((("features",), f"lists {', '.join(repeated)} more than once"))
        field_problems(problems)
        return self

    @property
    def selection(self) -> str:
        """What is retrieved, for messages and lineage: the service or the references."""
        if self.feature_service is not None:
            return f"feature service {self.feature_service}"
        return ", ".join(self.features or [])
