"""What one task hands the next, and what the training job hands its task: typed, validated on read.

    validate_data --ValidationSummary--> train --TrainResult--> gate --GateDecision--> register

Each payload is written to XCom with `model_dump(mode="json")` and read back with
`model_validate`: a field missing or of the wrong type fails the reading task naming the payload,
instead of a `dict.get` quietly returning None. Non-finite metrics (NaN ROC AUC on a one-class
holdout) travel as the strings "NaN" / "Infinity", which JSON can carry and pydantic reads back.
Light on purpose: pydantic and the snapshot manifest only (parse time imports operators).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, computed_field, model_validator
from pydantic.dataclasses import dataclass

from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.core.digest import combine
from airflow_trainpipe.core.exceptions import PayloadError

P = TypeVar("P", bound="Payload")


class Payload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="strings")

    def to_xcom(self) -> dict[str, Any]:
        """Plain JSON values; NaN and infinities as strings (dumping to Python objects would keep
        them as floats, which XCom's and MLflow's JSON refuse)."""
        plain: dict[str, Any] = json.loads(self.model_dump_json())
        return plain


def read_payload(model: type[P], raw: Any, source: str) -> P:
    """`raw` (an XCom value, a job's event) as `model`; PayloadError naming `source` otherwise."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "<payload>"
        raise PayloadError(
            f"{source} is not a {model.__name__}: {where}: {first['msg']}"
            + (f" (and {exc.error_count() - 1} more problem(s))" if exc.error_count() > 1 else "")
        ) from None


# -- validate_data -> train --------------------------------------------------------------------


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class Check:
    """One check's verdict; `column` is None for snapshot-wide checks. The validation engines
    build them (positionally, as a dataclass) and validate_data hands the failures to train
    inside its ValidationSummary: one definition for both."""

    kind: str  # schema | volume | expectation | drift
    name: str
    column: str | None
    passed: bool
    observed: Any
    expected: Any
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ReferenceSnapshot(Payload):
    """The validated snapshot drift (and volume) was compared with."""

    partition: str
    digest: str
    rows: int
    kind: Literal["previous", "champion"]


class ValidationSummary(Payload):
    """validate_data's result: the snapshot it froze and what the checks said about it.

    `manifest` is exactly what train must read: its files, their sha256s, the digest.
    """

    passed: bool
    manifest: Manifest
    reference: ReferenceSnapshot | None
    drift: dict[str, float]
    failures: list[Check]
    report_uri: str
    data_docs_uri: str | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def digest(self) -> str:
        return self.manifest.digest

    @computed_field  # type: ignore[prop-decorator]
    @property
    def rows(self) -> int:
        return self.manifest.rows

    @model_validator(mode="before")
    @classmethod
    def _drop_computed(cls, data: Any) -> Any:
        # A dumped summary carries its computed fields; they are derived, never read back.
        return (
            {k: v for k, v in data.items() if k not in ("digest", "rows")} if isinstance(data, dict) else data
        )

    @model_validator(mode="after")
    def _manifest_is_whole(self) -> ValidationSummary:
        if combine([f.sha256 for f in self.manifest.files]) != self.manifest.digest:
            raise ValueError(f"manifest {self.manifest.digest} does not hash to its digest")
        return self


# -- train -> gate -------------------------------------------------------------------------------


class SliceScore(Payload):
    """One slice of the holdout (`evaluation.slices`): both models' metrics on its rows."""

    slice: str
    """`column=value`, or `column=[a, b)` for a bin."""
    rows: int
    candidate: dict[str, float]
    champion: dict[str, float] | None = None


class Evaluation(Payload):
    """Candidate and champion scored by one function on the run's holdout rows."""

    holdout_rows: int | None = None
    candidate: dict[str, float]
    champion: dict[str, float] | None = None
    champion_version: str | None = None
    champion_run_id: str | None = None
    champion_error: str | None = None
    improvement_interval: tuple[float, float] | None = None
    """gate.confidence: the bootstrap interval of the primary metric's improvement (better > 0)."""
    slices: list[SliceScore] | None = None
    """evaluation.slices: each slice's metrics (None: the run computed none)."""


class TrainTiming(Payload):
    steps: int
    loop_s: float
    train_s: float
    checkpoint_s: float
    eval_s: float
    data_wait_s: float
    study_s: float = 0.0
    """A tuning trial's round trips to its study at rung ends (report, should_prune)."""
    startup_s: float = 0.0
    """This attempt's time from torchrun's start to the first step (runtime.startup)."""
    startup: dict[str, float] = {}
    """Where that time went, phase by phase."""
    end_s: float = 0.0
    """After the last step: final evaluation, weights, the logged model, candidate vs champion."""
    end: dict[str, float] = {}
    """Where that time went, phase by phase (runtime/finish.py)."""


class RungValue(Payload):
    """A tuning trial's objective at the end of one rung."""

    resource: int
    """Epochs (or steps) trained when the rung ended."""
    value: float
    """The objective on the validation split."""


class TrainResult(Payload):
    """The training job's `result` event (and result.json); the train task adds `run_dir`."""

    final_step: int
    final_train_loss: float | None
    holdout_metrics: dict[str, float]
    weights_sha256: str
    resumed_from_step: int
    steps_recomputed: int
    epochs_completed: int
    stopped_early: bool
    world_size: int
    peak_rss_mib: list[float] = []
    """Each rank's peak resident memory in this attempt, rank 0's through the final evaluation."""
    compute_hours_cpu: float | None = None
    compute_hours_gpu: float | None = None
    """Device-hours of every attempt (processes x wall time from torchrun's start to the result,
    start-up included; the time a killed attempt spent after its last checkpoint is lost)."""
    startup_compute_hours: float = 0.0
    """The part of the device-hours spent before first steps (every attempt's start-up)."""
    end_compute_hours: float = 0.0
    """The part spent after the last step (final evaluation, the logged model, the comparison)."""
    study_compute_hours: float = 0.0
    """A tuning trial's part spent asking its study at rung ends, over every attempt (the timing's
    `study_s` is this attempt's alone)."""
    timing: TrainTiming
    mlflow_run_id: str
    mlflow_experiment_id: str
    transform_hash: str
    evaluation: Evaluation | None
    """Candidate vs champion on the gate's holdout; None for a pruned tuning trial."""
    model_uri: str | None
    """The logged model; None for a pruned tuning trial (nothing is published)."""
    rungs: list[RungValue] = []
    """A tuning trial: the objective at each rung's end the job passed (every attempt's)."""
    pruned: bool = False
    """A tuning trial the study's pruner stopped at its last rung in `rungs`."""
    metrics_split: Literal["holdout", "validation"] = "holdout"
    """What `holdout_metrics` were scored on: a tuning trial scores its validation split."""
    validation_metrics: dict[str, float] = {}
    """The published weights' metrics on the validation split (`data.validation`), the ones that
    chose them; empty without a validation split."""
    weights_step: int | None = None
    """The step whose weights the run published: its best epoch's (`training.restore_best`), or
    the last step. None for a pruned tuning trial."""
    pretrained: dict[str, str] | None = None
    """The pretrained directory the model was fine-tuned from, as the run pinned it: `uri` (as
    configured), `source` (what was read: a directory URI or `models:/NAME/N`) and `sha256`."""
    run_dir: str | None = None

    @property
    def compute_hours(self) -> float:
        """Device-hours of every attempt, on whichever device the job ran."""
        return (self.compute_hours_cpu or 0.0) + (self.compute_hours_gpu or 0.0)

    def candidate(self, source: str) -> tuple[Evaluation, str]:
        """(evaluation, model URI) of a result that can be gated; PayloadError naming `source` otherwise."""
        if self.evaluation is None or self.model_uri is None:
            raise PayloadError(
                f"{source} is a pruned tuning trial (step {self.final_step}), not a candidate: "
                "it has no logged model or holdout evaluation"
            )
        return self.evaluation, self.model_uri


# -- gate -> register ----------------------------------------------------------------------------


class GuardrailCheck(Payload):
    metric: str
    direction: str
    candidate: float
    champion: float
    regression: float
    relative_regression: float | None
    max_regression: float | None
    max_relative_regression: float | None
    passed: bool


class SliceCheck(Payload):
    """gate.slice_guardrail on one slice with at least `min_rows` rows."""

    slice: str
    rows: int
    metric: str
    candidate: float
    champion: float
    regression: float
    """> 0: the candidate is worse on this slice."""
    max_regression: float
    passed: bool


class GateDecision(Payload):
    """The gate's verdict on one candidate run, with the numbers it was decided on."""

    model_config = ConfigDict(extra="forbid", frozen=False, ser_json_inf_nan="strings")

    promote: bool
    reason: str
    metric: str
    direction: str
    candidate: float
    champion: float | None
    improvement: float | None = None
    relative_improvement: float | None = None
    min_improvement: float = 0.0
    min_relative_improvement: float = 0.0
    guardrails: list[GuardrailCheck] = Field(default_factory=list)
    confidence: float | None = None
    improvement_interval: tuple[float, float] | None = None
    slice_checks: list[SliceCheck] = Field(default_factory=list)
    forced: bool = False
    fail: bool = False  # no champion and `no_champion.action: fail`
    # What the decision is about (set by the gate task):
    mlflow_run_id: str | None = None
    model_name: str | None = None
    alias: str | None = None
    champion_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe (non-finite numbers as strings): for XCom, MLflow artifacts and tags."""
        return self.to_xcom()
