"""The whole pipeline config: identity plus one section per stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from airflow_trainpipe.config.base import Section, field_problems
from airflow_trainpipe.config.canary import CanarySection, canary_fit_problems
from airflow_trainpipe.config.catalog import METRICS
from airflow_trainpipe.config.data import (
    DataSection,
    holdout_key_problems,
    pod_reach_problems,
    ranking_problems,
    validation_split_problems,
)
from airflow_trainpipe.config.evaluation import EvaluationSection, scoring_problems
from airflow_trainpipe.config.features import FeaturesSection, transform_column_problems
from airflow_trainpipe.config.gate import GateSection, gate_metric_problems, slice_guardrail_problems
from airflow_trainpipe.config.model_args import model_args_problems
from airflow_trainpipe.config.notify import NotifySection, deadline_alert_problems
from airflow_trainpipe.config.register import RegisterSection
from airflow_trainpipe.config.schedule import ScheduleSection
from airflow_trainpipe.config.sources import SnapshotsSection
from airflow_trainpipe.config.text import text_model_problems, text_problems
from airflow_trainpipe.config.training import TrainingSection
from airflow_trainpipe.config.tuning import TuningSection, objective_problems, search_space_problems
from airflow_trainpipe.config.types import DagId, DagTag
from airflow_trainpipe.config.validation import (
    ValidationSection,
    contract_coverage_problems,
    drift_threshold_problems,
    engine_problems,
)


class PipelineConfig(Section):
    """One retrain pipeline: wait_for_data -> validate_data -> train -> gate -> register."""

    pipeline: DagId
    """Pipeline name; becomes the Airflow DAG id (letters, digits, `_`, `.`, `-`)."""

    owner: str = Field(default="airflow", min_length=1)
    """Owner shown in the Airflow UI."""

    description: str | None = None
    """One-line description shown in the Airflow UI."""

    tags: list[DagTag] = []
    """Airflow DAG tags."""

    schedule: ScheduleSection
    """When it runs."""

    data: DataSection
    """What it trains on."""

    snapshots: SnapshotsSection = SnapshotsSection()
    """Where runs of a `sql`, `delta` or `iceberg` source freeze the rows they validate and train on."""

    features: FeaturesSection = FeaturesSection()
    """How raw columns become model inputs (fitted on the training split, shipped inside the model)."""

    validation: ValidationSection = ValidationSection()
    """Checks before training."""

    training: TrainingSection
    """How it trains."""

    evaluation: EvaluationSection = EvaluationSection()
    """How the holdout is scored (candidate and champion alike)."""

    gate: GateSection
    """When a candidate replaces the champion."""

    # `register` would shadow ABCMeta.register on the model class, hence the alias.
    registration: RegisterSection = Field(default=RegisterSection(), alias="register")
    """Where promoted models go."""

    notify: NotifySection | None = None
    """Who is e-mailed about failures, promotions, approvals and missed deadlines; null: nobody."""

    tuning: TuningSection | None = None
    """Hyperparameter search (Optuna) whose best trial becomes the candidate; null: no search."""

    canary: CanarySection | None = None
    """Canary release of the gate's winner before it becomes champion; null: the gate (and
    approval) decide alone."""

    @property
    def registered_model_name(self) -> str:
        return self.registration.model_name or self.pipeline

    @property
    def content_hash(self) -> str:
        """sha256 of the validated config as canonical JSON: formatting and comments do not change
        it, any setting does. Recorded on MLflow runs and model versions (lineage)."""
        import hashlib
        import json

        text = json.dumps(self.model_dump(mode="json", by_alias=True), sort_keys=True, separators=(",", ":"))
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    @property
    def gate_direction(self) -> str:
        return self.gate.direction or METRICS[self.training.task][self.gate.metric]

    @property
    def tuning_objective(self) -> tuple[str, Literal["maximize", "minimize"]]:
        """(metric, direction) a study optimises: tuning.objective, defaulting to the gate's."""
        objective = self.tuning.objective if self.tuning is not None else None
        metric = (objective.metric if objective else None) or self.gate.metric
        return metric, (objective.direction if objective else None) or METRICS[self.training.task][metric]

    @property
    def trial_nproc_per_node(self) -> int:
        """Processes per node of one trial: `tuning.nproc_per_trial`, else the train task's."""
        per_trial = self.tuning.nproc_per_trial if self.tuning is not None else None
        return per_trial or self.training.resources.nproc_per_node

    @property
    def tuning_max_resource(self) -> int:
        """The full budget of a trial, in the pruning resource (epochs, or max_steps)."""
        hp = self.training.hyperparameters
        return self.tuning.max_resource(hp) if self.tuning is not None else hp.epochs

    @model_validator(mode="after")
    def _sections_agree(self) -> PipelineConfig:
        """Gather the rules across sections (each lives beside the section it is about), in one error."""
        data, columns, training, task = self.data, self.data.features, self.training, self.training.task
        field_problems(
            [
                *gate_metric_problems(self.gate, task),
                *transform_column_problems(self.features, columns),
                *drift_threshold_problems(self.validation.drift, columns),
                *text_problems(columns.text, [*columns.numeric, *columns.categorical], self.features.text),
                *text_model_problems(training, columns.text, self.features.text),
                *model_args_problems(
                    training.model,
                    training.hyperparameters.model_args,
                    ("training", "hyperparameters", "model_args"),
                ),
                *contract_coverage_problems(self.validation.contract, data),
                *pod_reach_problems(data, self.snapshots, training, self.tuning),
                *holdout_key_problems(data),
                *validation_split_problems(data, self.tuning),
                *engine_problems(self.validation, data),
                *ranking_problems(data, task),
                *scoring_problems(self.evaluation, task, columns),
                *slice_guardrail_problems(self.gate, task, self.evaluation),
                *deadline_alert_problems(self.schedule, self.notify),
                *objective_problems(self.tuning, training, self.gate.metric),
                *search_space_problems(self.tuning, training),
                *canary_fit_problems(self.canary, self.registration, task),
            ]
        )
        return self
