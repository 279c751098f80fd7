"""Our custom facets: what the standard facets cannot say about a snapshot, a model and the gate.

Each is an attrs class of the OpenLineage client, like the standard ones, so the provider
serialises it with `_producer` and `_schemaURL`; the JSON schema of all three ships beside this
module (`facets.json`, its `$id` the URL below) and is documented in docs/lineage.md.
"""

from __future__ import annotations

import attr
from openlineage.client.facet_v2 import DatasetFacet, RunFacet

SCHEMA_URL = "https://airflow-trainpipe.dev/spec/facets/1-0-0/TrainpipeFacets.json"


@attr.define
class TrainpipeSnapshotDatasetFacet(DatasetFacet):
    """A frozen snapshot: the data version every run and model version names."""

    digest: str
    rows: int
    files: int
    sourceKind: str
    origin: str | None = attr.field(default=None)
    window: list[str] | None = attr.field(default=None)
    missing: list[str] | None = attr.field(default=None)
    featureProject: str | None = attr.field(default=None)
    features: list[str] | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_URL}#/$defs/TrainpipeSnapshotDatasetFacet"


@attr.define
class TrainpipeModelDatasetFacet(DatasetFacet):
    """A trained model (an MLflow run's) or a registered version of one."""

    mlflowRunId: str
    dataDigest: str | None = attr.field(default=None)
    modelUri: str | None = attr.field(default=None)
    transformHash: str | None = attr.field(default=None)
    metrics: dict[str, float] | None = attr.field(default=None)
    modelName: str | None = attr.field(default=None)
    version: str | None = attr.field(default=None)
    alias: str | None = attr.field(default=None)
    promoted: bool | None = attr.field(default=None)
    previousVersion: str | None = attr.field(default=None)

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_URL}#/$defs/TrainpipeModelDatasetFacet"


@attr.define
class TrainpipeGateRunFacet(RunFacet):
    """The gate's decision: the candidate against the champion on the same holdout."""

    promote: bool
    reason: str
    metric: str
    direction: str
    candidate: float
    champion: float | None = attr.field(default=None)
    championVersion: str | None = attr.field(default=None)
    improvement: float | None = attr.field(default=None)
    improvementInterval: list[float] | None = attr.field(default=None)
    confidence: float | None = attr.field(default=None)
    failedGuardrails: list[str] | None = attr.field(default=None)
    failedSlices: list[str] | None = attr.field(default=None)
    forced: bool = attr.field(default=False)

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_URL}#/$defs/TrainpipeGateRunFacet"
