"""The contract between a launcher and the training entrypoint.

`python -m airflow_trainpipe.runtime.train --spec <json>` runs one training job described by a
TrainSpec. The local launcher (a torchrun child of the Airflow worker), the Kubernetes pod and
`trainpipe train` all build the same spec, so every launcher starts exactly the same job.
Credentials are never part of it; they arrive as environment variables from connections.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.storage import join, resolve


class TrainSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    config: PipelineConfig
    """The validated pipeline config (pods do not have the dags folder)."""

    run_id: str = Field(min_length=1)
    """Airflow run id (or any id for `trainpipe train`); scopes checkpoints and the MLflow run."""

    data_files: list[str] = Field(min_length=1)
    """Exactly the files this run trains on, as absolute URIs, in a fixed order."""

    data_digest: str | None = None
    """Content digest of the data snapshot, recorded as the data version (lineage)."""

    max_steps: int | None = Field(default=None, gt=0)
    """Stop after this many optimizer steps (debugging); overrides hyperparameters.max_steps."""

    hyperparameter_overrides: dict[str, Any] = {}
    """Per-run overrides of `training.hyperparameters` (from the trigger form)."""

    mlflow_run_id: str | None = None
    """Resume into this MLflow run (a retry of the same task)."""

    tags: dict[str, str] = {}
    """Extra MLflow tags: dag id, task id, try number, ..."""

    @property
    def run_dir(self) -> str:
        """`<checkpoint.uri>/<pipeline>/<run_id>`: checkpoints, result.json, the run's state."""
        return join(resolve(self.config.training.checkpoint.uri), self.config.pipeline, _safe(self.run_id))

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str) -> TrainSpec:
        return cls.model_validate_json(text)


def _safe(run_id: str) -> str:
    # Airflow run ids contain ':' and '+' (manual__2026-01-01T00:00:00+00:00); keep them
    # readable but valid as a single path segment on every filesystem and object store.
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in run_id)
