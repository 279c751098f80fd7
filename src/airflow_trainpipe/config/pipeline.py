"""The whole pipeline config: identity plus one section per stage."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.canary import CanarySection
from airflow_trainpipe.config.catalog import METRICS
from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.evaluation import EvaluationSection
from airflow_trainpipe.config.features import FeaturesSection
from airflow_trainpipe.config.gate import GateSection
from airflow_trainpipe.config.notify import NotifySection
from airflow_trainpipe.config.register import RegisterSection
from airflow_trainpipe.config.schedule import ScheduleSection
from airflow_trainpipe.config.sources import SnapshotsSection
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.config.text import (
    ENCODER_SHAPE_ARGS,
    text_inputs,
    text_problems,
    tokenizer_fields_set,
)
from airflow_trainpipe.config.training import TrainingSection, pod_storage_problems
from airflow_trainpipe.config.tuning import (
    MODEL_ARGS_PREFIX,
    TUNABLE,
    TuningSection,
    hyperparameter_overrides,
)
from airflow_trainpipe.config.types import DagId, DagTag
from airflow_trainpipe.config.validation import ValidationSection


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
    def tuning_max_resource(self) -> int:
        """The full budget of a trial, in the pruning resource (epochs, or max_steps)."""
        hp = self.training.hyperparameters
        return self.tuning.max_resource(hp) if self.tuning is not None else hp.epochs

    @model_validator(mode="after")
    def _sections_agree(self) -> PipelineConfig:
        field_problems(
            [
                *self._gate_problems(),
                *self._feature_problems(),
                *self._text_problems(),
                *self._data_problems(),
                *self._evaluation_problems(),
                *self._notify_problems(),
                *self._tuning_problems(),
                *self._canary_problems(),
            ]
        )
        return self

    def _tuning_problems(self) -> FieldProblems:
        if self.tuning is None:
            return []
        problems: FieldProblems = []
        metrics, task, objective = METRICS[self.training.task], self.training.task, self.tuning.objective
        if objective.metric is not None and objective.metric not in metrics:
            problems.append(
                (
                    ("tuning", "objective", "metric"),
                    f"{objective.metric!r} is not a {task} metric"
                    f"{did_you_mean(objective.metric, metrics)}; expected one of {', '.join(metrics)}",
                )
            )
        elif objective.direction and objective.direction != metrics[self.tuning_objective[0]]:
            metric = self.tuning_objective[0]
            problems.append(
                (
                    ("tuning", "objective", "direction"),
                    f"{metric} is better when it is {'higher' if metrics[metric] == 'maximize' else 'lower'}",
                )
            )
        if self.tuning.pruning.resource == "steps" and self.training.hyperparameters.max_steps is None:
            problems.append(
                (
                    ("tuning", "pruning", "resource"),
                    "rungs in steps need training.hyperparameters.max_steps (a trial's full budget)",
                )
            )
        return [*problems, *self._search_space_problems()]

    def _search_space_problems(self) -> FieldProblems:
        """Every name is tunable, and every bound and choice is a valid value of its hyperparameter."""
        from pydantic import ValidationError

        assert self.tuning is not None
        problems: FieldProblems = []
        hp = self.training.hyperparameters
        for name, dimension in self.tuning.space.items():
            where = ("tuning", "space", name)
            if not (
                name in TUNABLE or (name.startswith(MODEL_ARGS_PREFIX) and len(name) > len(MODEL_ARGS_PREFIX))
            ):
                problems.append(
                    (
                        where,
                        f"{name!r} cannot be tuned{did_you_mean(name, TUNABLE)}; expected one of "
                        f"{', '.join(TUNABLE)} or model_args.<argument>",
                    )
                )
                continue
            values = dimension.choices if dimension.type == "categorical" else [dimension.low, dimension.high]
            for value in values:
                try:
                    hp.with_overrides(hyperparameter_overrides(hp.model_args, {name: value}))
                except ValidationError as exc:
                    problems.append((where, f"{value!r} is not a valid {name}: {exc.errors()[0]['msg']}"))
                    break
        return problems

    def _canary_problems(self) -> FieldProblems:
        if self.canary is None:
            return []
        problems: FieldProblems = []
        registration = self.registration
        taken = {registration.alias, registration.previous_alias}
        if registration.approval == "required":
            taken.add(registration.staging_alias)
        if self.canary.alias in taken:
            problems.append(
                (
                    ("canary", "alias"),
                    f"must differ from the register section's aliases {sorted(a for a in taken if a)}",
                )
            )
        if self.canary.checks.max_disagreement is not None and self.training.task not in (
            "binary_classification",
            "multiclass_classification",
        ):
            problems.append(
                (
                    ("canary", "checks", "max_disagreement"),
                    f"a {self.training.task} model makes no decision to disagree on: set it to null "
                    "and compare scores with max_score_distance",
                )
            )
        return problems

    def _notify_problems(self) -> FieldProblems:
        # A deadline or an approval whose alert goes nowhere is a silent misconfiguration.
        events = self.notify.events if self.notify is not None else []
        if self.schedule.deadline is not None and "deadline_missed" not in events:
            return [
                (
                    ("schedule", "deadline"),
                    "a missed deadline is announced by e-mail: add a `notify` section whose events "
                    "include deadline_missed",
                )
            ]
        return []

    def _gate_problems(self) -> FieldProblems:
        problems: FieldProblems = []
        metrics = METRICS[self.training.task]
        task = self.training.task
        if self.gate.metric not in metrics:
            problems.append(
                (
                    ("gate", "metric"),
                    f"{self.gate.metric!r} is not a {task} metric"
                    f"{did_you_mean(self.gate.metric, metrics)}; expected one of {', '.join(metrics)}",
                )
            )
        elif self.gate.direction and self.gate.direction != metrics[self.gate.metric]:
            problems.append(
                (
                    ("gate", "direction"),
                    f"{self.gate.metric} is better when it is "
                    f"{'higher' if metrics[self.gate.metric] == 'maximize' else 'lower'}; "
                    f"direction must be {metrics[self.gate.metric]!r}, got {self.gate.direction!r}",
                )
            )
        for i, guardrail in enumerate(self.gate.guardrails):
            if guardrail.metric not in metrics:
                problems.append(
                    (
                        ("gate", "guardrails", i, "metric"),
                        f"{guardrail.metric!r} is not a {task} metric"
                        f"{did_you_mean(guardrail.metric, metrics)}; expected one of {', '.join(metrics)}",
                    )
                )
            elif guardrail.metric == self.gate.metric:
                problems.append(
                    (("gate", "guardrails", i, "metric"), "the primary metric cannot also be a guardrail")
                )
        return problems

    def _evaluation_problems(self) -> FieldProblems:
        problems: FieldProblems = []
        if self.training.task != "binary_classification" and self.evaluation.threshold != 0.5:
            why = {
                "multiclass_classification": "predicts the most probable class",
                "ranking": "orders rows by score",
            }.get(self.training.task, "predicts values, not classes")
            problems.append(
                (
                    ("evaluation", "threshold"),
                    f"a {self.training.task} model {why}: a threshold applies to binary_classification only",
                )
            )
        features = self.data.features
        for i, spec in enumerate(self.evaluation.slices):
            where = ("evaluation", "slices", i)
            if spec.column in features.numeric and spec.bins is None:
                problems.append(
                    ((*where, "bins"), f"numeric column {spec.column!r} is sliced by bins: give edges")
                )
            elif spec.column in features.categorical and spec.bins is not None:
                problems.append(
                    ((*where, "bins"), f"categorical column {spec.column!r} is sliced by value, not bins")
                )
            elif spec.column in features.text and spec.bins is None:
                problems.append(
                    (
                        (*where, "bins"),
                        f"text column {spec.column!r} is sliced by its length: give bins (characters)",
                    )
                )
            elif spec.column not in features.all:
                problems.append(
                    (
                        (*where, "column"),
                        f"{spec.column!r} is not a feature column{did_you_mean(spec.column, features.all)}; "
                        "a slice is read with the features",
                    )
                )
        guardrail = self.gate.slice_guardrail
        if guardrail is not None:
            metrics = METRICS[self.training.task]
            if guardrail.metric is not None and guardrail.metric not in metrics:
                problems.append(
                    (
                        ("gate", "slice_guardrail", "metric"),
                        f"{guardrail.metric!r} is not a {self.training.task} metric"
                        f"{did_you_mean(guardrail.metric, metrics)}; expected one of {', '.join(metrics)}",
                    )
                )
            if not self.evaluation.slices:
                problems.append((("gate", "slice_guardrail"), "there are no evaluation.slices to guard"))
        return problems

    def _feature_problems(self) -> FieldProblems:
        problems: FieldProblems = []
        features = self.data.features.all
        for kind, declared in (
            ("numeric", self.data.features.numeric),
            ("categorical", self.data.features.categorical),
        ):
            other = self.data.features.categorical if kind == "numeric" else self.data.features.numeric
            for name in getattr(self.features, kind):
                if name in declared:
                    continue
                where = (
                    f"it is a {'categorical' if kind == 'numeric' else 'numeric'} feature in data.features"
                    if name in other
                    else f"it is not a {kind} feature in data.features{did_you_mean(name, declared)}"
                )
                problems.append((("features", kind, name), f"no {kind} transform for {name!r}: {where}"))
        if self.validation.drift is not None:
            for name in self.validation.drift.feature_thresholds:
                if name not in features:
                    problems.append(
                        (
                            ("validation", "drift", "feature_thresholds", name),
                            f"{name!r} is not a feature in data.features{did_you_mean(name, features)}",
                        )
                    )
        return problems

    def _text_problems(self) -> FieldProblems:
        """`features.text` against the text columns, and the model against the text it is given."""
        features, model = self.data.features, self.training.model
        problems = text_problems(
            features.text, [*features.numeric, *features.categorical], self.features.text
        )
        if model == "text_encoder" and not features.text:
            problems.append((("training", "model"), "text_encoder reads text: declare data.features.text"))
        if model == "tabular_mlp" and features.text:
            problems.append(
                (
                    ("data", "features", "text"),
                    "tabular_mlp reads no text: use training.model text_encoder, or a model plugin that reads text",
                )
            )
        if self.training.pretrained is not None:
            return problems + self._pretrained_problems()
        if model == "text_encoder":
            positions = self.training.hyperparameters.model_args.get("max_position_embeddings", 512)
            for name in features.text:
                length = self.features.text_transform(name).max_length
                if isinstance(positions, int) and length > positions:
                    problems.append(
                        (
                            ("features", "text", name, "max_length"),
                            f"{length} tokens is more than the encoder's {positions} positions "
                            "(training.hyperparameters.model_args.max_position_embeddings)",
                        )
                    )
        return problems

    def _pretrained_problems(self) -> FieldProblems:
        """A pretrained directory brings the encoder's shape and the tokenizer: the config sets
        neither, and the model reads it through one text input."""
        where, model = ("training", "pretrained"), self.training.model
        if model != "text_encoder":
            return [
                (
                    where,
                    f"a pretrained directory is read by model text_encoder; {model!r} builds its own weights",
                )
            ]
        inputs = text_inputs(self.data.features.text, self.features.text)
        if len(inputs) != 1:
            names = ", ".join(name for name, _ in inputs)
            return [
                (
                    where,
                    f"a pretrained encoder reads one text input (a column, or two joined with pair_with); "
                    f"data.features.text gives {len(inputs)}: {names}",
                )
            ]
        problems: FieldProblems = []
        for key in sorted(set(self.training.hyperparameters.model_args) & set(ENCODER_SHAPE_ARGS)):
            problems.append(
                (
                    ("training", "hyperparameters", "model_args", key),
                    f"comes from the pretrained directory's config.json ({self.training.pretrained}); remove it",
                )
            )
        for name, transform in self.features.text.items():
            for field in tokenizer_fields_set(transform):
                if field != "max_length":
                    problems.append(
                        (
                            ("features", "text", name, field),
                            f"the pretrained directory's tokenizer applies ({self.training.pretrained}); "
                            "remove it (max_length and pair_with still apply)",
                        )
                    )
        return problems

    def _data_problems(self) -> FieldProblems:
        problems: FieldProblems = []
        features = self.data.features.all
        contract = self.validation.contract.columns
        if contract:
            needed = [
                self.data.label,
                *features,
                *filter(None, [self.data.holdout.key_column, self.data.group]),
            ]
            missing = [name for name in needed if name not in contract]
            if missing:
                problems.append(
                    (
                        ("validation", "schema", "columns"),
                        f"the contract leaves out {', '.join(map(repr, missing))}, which data uses (label, features, holdout key, group)",
                    )
                )
        if self.training.launcher == "kubernetes":
            problems.extend(pod_storage_problems(self.data.uri, self.training.kubernetes, ("data", "uri")))
            tuning = self.tuning
            if tuning is not None and tuning.pruning.kind != "none" and tuning.storage_conn_id is None:
                problems.append(
                    (
                        ("tuning", "storage_conn_id"),
                        "a trial's pod reports its rungs to the study: name the connection of a database "
                        "the pods reach (the default SQLite file is on the Airflow worker)",
                    )
                )
            if self.data.source.kind != "files" or self.data.freeze is True:
                problems.extend(
                    pod_storage_problems(self.snapshots.uri, self.training.kubernetes, ("snapshots", "uri"))
                )
        if self.data.holdout.key_column == self.data.label:
            problems.append((("data", "holdout", "key_column"), "the split key cannot be the label column"))
        return [*problems, *self._engine_problems(), *self._ranking_problems()]

    def _engine_problems(self) -> FieldProblems:
        """`validation.engine` against the data it runs on."""
        problems: FieldProblems = []
        if self.validation.engine == "sql" and self.data.source.kind != "sql":
            problems.append(
                (
                    ("validation", "engine"),
                    "engine 'sql' runs the checks in the source's database: it needs a data.source of kind 'sql'",
                )
            )
        if self.validation.engine == "spark" and self.data.format != "parquet":
            problems.append(
                (
                    ("validation", "engine"),
                    "engine 'spark' reads the snapshot's Parquet files: it needs data.format parquet",
                )
            )
        if self.validation.engine == "spark" and self.data.freeze == "versions":
            problems.append(
                (
                    ("validation", "engine"),
                    "engine 'spark' reads files by path, and Hadoop's s3a cannot read a pinned object "
                    "version: use data.freeze: true (copies) or engine stream",
                )
            )
        if self.data.feature_store is not None and self.validation.engine == "sql":
            problems.append(
                (
                    ("validation", "engine"),
                    "engine 'sql' checks the query's rows in the database, but the run trains on them joined "
                    "with the feature store's features: use engine stream (or spark), which reads the joined snapshot",
                )
            )
        if self.validation.spark_remote is not None and self.validation.engine != "spark":
            problems.append(
                (
                    ("validation", "spark_remote"),
                    "only engine 'spark' reads spark_remote; set validation.engine: spark or remove it",
                )
            )
        return problems

    def _ranking_problems(self) -> FieldProblems:
        data, training = self.data, self.training
        problems: FieldProblems = []
        # (training.ranking_loss is not checked: a serialized config carries its default everywhere.)
        if training.task != "ranking":
            if data.group is not None:
                problems.append((("data", "group"), f"group applies to task ranking, not {training.task}"))
        elif data.group is None:
            problems.append(
                (("data", "group"), "task ranking needs the query column its rows are ranked within")
            )
        elif data.holdout.key_column not in (None, data.group):
            problems.append(
                (
                    ("data", "holdout", "key_column"),
                    f"a ranking holdout keeps whole groups, split by data.group {data.group!r}; "
                    f"remove key_column {data.holdout.key_column!r}",
                )
            )
        return problems
