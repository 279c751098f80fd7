"""The contract between a launcher and the training entrypoint.

`python -m airflow_trainpipe.runtime.train --spec <json>` runs one training job described by a
TrainSpec. The local launcher (a torchrun child of the Airflow worker), the Kubernetes pod and
`trainpipe train` all build the same spec, so every launcher starts exactly the same job.
Credentials are never part of it; they arrive as environment variables from connections.
"""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from airflow_trainpipe.config import PipelineConfig
from airflow_trainpipe.config.data import ValidationSplit
from airflow_trainpipe.config.training import Hyperparameters
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.core.storage import join, resolve


class PretrainedPin(BaseModel):
    """The exact bytes of a run's pretrained directory (`training.pretrained`): what every attempt,
    every node and a reproduction read (runtime.pretrained.source)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    uri: str
    """As configured."""
    source: str
    """Where the bytes are read: a directory URI, or `models:/NAME/VERSION` (never an alias)."""
    sha256: str
    """Of the directory's files, their names and contents."""
    files: dict[str, str] = {}
    """Each file's sha256, by its name in the directory."""


class TrialRung(BaseModel):
    """One rung of a tuning trial: trained on the training rows minus `validation`, scored on it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    number: int = Field(ge=0)
    """The Optuna trial number."""
    validation: ValidationSplit
    final: bool
    """The trial's full budget: the model is logged and scored against the champion on the gate's
    holdout, so the study's best trial can be the gate's candidate. Earlier rungs only train,
    checkpoint (also mid-epoch) and report the validation metrics."""
    study_run_id: str | None = None
    """The study's run id: its trials read one pretrained pin, in the study's run directory
    (`training.pretrained`), so an alias that moves mid-study does not give trials other weights."""
    rungs: list[int] = []
    """The ends of the trial's rungs before its full budget, in the pruning resource (epochs, or
    steps): at each the job reports the objective to the study and stops when its pruner says so.
    Empty: the job only trains (a study's baseline, or a trial without pruning)."""
    study_name: str | None = None
    """The Optuna study the rungs are reported to (its storage URL arrives in the environment,
    TRAINPIPE_OPTUNA_STORAGE: it may hold a password)."""
    trial_id: int | None = None
    """The trial's id in that storage (not its number, which is per study)."""
    budget: int | None = None
    """The trial's full budget in the pruning resource (epochs, or steps): its learning-rate
    schedule spans it, so a trial continued rung by rung, or a job trained to a rung alone, follows
    the curve of one trained in one go. None: the job's own budget (a spec from before it)."""

    @model_validator(mode="after")
    def _rungs_have_a_study(self) -> TrialRung:
        if self.rungs and (self.study_name is None or self.trial_id is None):
            raise ValueError("a trial with rungs names its study_name and trial_id")
        if self.rungs != sorted(set(self.rungs)):
            raise ValueError(f"rungs must increase: {self.rungs}")
        return self


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

    manifest: Manifest | None = None
    """The validated snapshot of `data_files`: the job checks every file's bytes against it."""

    hyperparameters: Hyperparameters
    """This run's effective, validated hyperparameters: the config's, with the run's overrides
    (trigger form) and step limit applied. The job reads these, never the config's. Default:
    the config's own."""

    mlflow_run_id: str | None = None
    """Resume into this MLflow run (a retry of the same task)."""

    tags: dict[str, str] = {}
    """Extra MLflow tags: dag id, task id, try number, ..."""

    trial: TrialRung | None = None
    """Set when the job is a rung of a tuning trial."""

    pretrained: PretrainedPin | None = None
    """Read exactly these pretrained bytes (`trainpipe reproduce`); None: pin what
    `training.pretrained` names when the run first reads it."""

    @classmethod
    def from_manifest(
        cls,
        config: PipelineConfig,
        run_id: str,
        manifest: Manifest | None,
        files: list[str] | None = None,
        **fields: Any,
    ) -> TrainSpec:
        """A job on a snapshot: its files and digest are the manifest's. Without a manifest, on
        `files` as given (a hand-written task, `trainpipe train --data`): unverified."""
        if manifest is None:
            return cls(config=config, run_id=run_id, data_files=files or [], **fields)
        return cls(config=config, run_id=run_id, manifest=manifest, **fields)

    @model_validator(mode="before")
    @classmethod
    def _config_hyperparameters_by_default(cls, data: Any) -> Any:
        if (
            isinstance(data, dict)
            and "hyperparameters" not in data
            and isinstance(data.get("config"), PipelineConfig)
        ):
            return {**data, "hyperparameters": data["config"].training.hyperparameters}
        return data

    @model_validator(mode="before")
    @classmethod
    def _files_and_digest_from_the_manifest(cls, data: Any) -> Any:
        """A spec given its manifest alone reads the manifest's files and digest (they are written
        out in the JSON all the same: a pod reads them without resolving anything)."""
        if isinstance(data, dict) and data.get("manifest") is not None and "data_files" not in data:
            manifest = Manifest.model_validate(data["manifest"])
            return {**data, "data_files": manifest.file_uris, "data_digest": manifest.digest}
        return data

    @property
    def overrides(self) -> dict[str, Any]:
        """The hyperparameters that differ from the config's (lineage)."""
        configured = self.config.training.hyperparameters
        return {
            k: v
            for k, v in self.hyperparameters.model_dump(mode="json").items()
            if getattr(configured, k) != getattr(self.hyperparameters, k)
        }

    def limited_to(self, max_steps: int) -> TrainSpec:
        """The same job, stopping after `max_steps` optimizer steps (or its own limit, if smaller)."""
        return self.model_copy(
            update={"hyperparameters": self.hyperparameters.with_overrides({}, max_steps=max_steps)}
        )

    @model_validator(mode="after")
    def _files_are_the_manifests(self) -> TrainSpec:
        if self.manifest is not None:
            if self.manifest.file_uris != self.data_files:
                raise ValueError(f"data_files are not the files of manifest {self.manifest.digest}")
            if self.data_digest not in (None, self.manifest.digest):
                raise ValueError(
                    f"data_digest {self.data_digest} is not the manifest's digest {self.manifest.digest}"
                )
        return self

    @property
    def run_dir(self) -> str:
        """`<checkpoint.uri>/<pipeline>/<run_id>`: checkpoints, result.json, the run's state."""
        return join(
            resolve(self.config.training.checkpoint.uri), self.config.pipeline, run_dir_name(self.run_id)
        )

    @property
    def pin_dir(self) -> str:
        """Where the run's pretrained pin is kept: a tuning trial shares its study's."""
        if self.trial is None or self.trial.study_run_id is None:
            return self.run_dir
        return join(
            resolve(self.config.training.checkpoint.uri),
            self.config.pipeline,
            run_dir_name(self.trial.study_run_id),
        )

    def to_json(self) -> str:
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json(cls, text: str) -> TrainSpec:
        return cls.model_validate_json(text)


# Characters a run directory name keeps as they are; every other byte is written `~XX`.
_KEPT = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.")
_MAX_SEGMENT = 200  # object stores and filesystems allow 255 bytes per path segment


def run_dir_name(run_id: str) -> str:
    """One path segment per run id: readable, injective, never `.`, `..` or hidden.

    Airflow run ids contain ':' and '+' (manual__2026-01-01T00:00:00+00:00) and, when given
    through the API, anything else. Replacing those characters with one symbol would map two
    run ids to one directory, whose checkpoints the second run would resume from; and `..`
    would make the run directory the pipeline's checkpoint root, where pruning deletes other
    runs' checkpoints. So every byte outside [A-Za-z0-9_.-] becomes `~XX` (its hex value, `~`
    itself included: distinct ids stay distinct), and a leading dot is escaped too.
    """
    encoded = "".join(chr(b) if chr(b) in _KEPT else f"~{b:02X}" for b in run_id.encode("utf-8"))
    if encoded.startswith("."):
        encoded = "~2E" + encoded[1:]
    if len(encoded) > _MAX_SEGMENT:
        # `~~` never occurs in an encoding, so a shortened name cannot equal a full one.
        encoded = encoded[:150] + "~~" + hashlib.sha256(run_id.encode("utf-8")).hexdigest()[:32]
    return encoded
