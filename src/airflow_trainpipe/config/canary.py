"""`canary`: the gate's winner serves real traffic beside the champion before it becomes champion."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.catalog import Task
from airflow_trainpipe.config.register import RegisterSection
from airflow_trainpipe.config.types import Alias, PositiveDuration


class LatencyCheck(Section):
    """The candidate's latency at a percentile, measured where the traffic is split."""

    percentile: float = Field(default=99.0, gt=0.0, lt=100.0)
    """Which percentile of the step's candidate requests (99: the slowest 1% are above it)."""

    max_ms: float = Field(default=500.0, gt=0.0)
    """The step fails when that percentile is above this many milliseconds."""


class CanaryChecks(Section):
    """What must hold at every step, measured on the step's own requests; null turns a check off."""

    max_error_rate: float | None = Field(default=0.01, ge=0.0, le=1.0)
    """Share of the candidate's requests answered with an error (a 5xx, or no answer in time).
    Holding 0.01 with no errors takes 381 requests at 95% confidence; 0 allows none."""

    latency: LatencyCheck | None = LatencyCheck()
    """The candidate's latency percentile (router to model and back)."""

    max_disagreement: float | None = Field(default=0.05, ge=0.0, le=1.0)
    """Share of rows, scored by both models on the same request, whose decisions differ: the class
    at each model's own threshold (binary) or the top class (multiclass). Catches a candidate whose
    holdout metric looks fine but which answers real traffic differently from the champion."""

    max_score_distance: float | None = Field(default=None, ge=0.0, le=1.0)
    """Largest gap between the two models' score distributions on the same rows (the two-sample
    Kolmogorov-Smirnov statistic, 0 to 1); for regression and ranking, where no decision exists."""

    min_requests: PositiveInt = 50
    """Candidate requests a step needs before any check decides: a check fails early only with
    this many (and once its interval clears its threshold), and a step that ends with fewer fails
    for lack of evidence (nothing is promoted on silence)."""


class LocalServing(Section):
    """`backend: local`: both models under `mlflow models serve` on 127.0.0.1 behind a weighted router."""

    host: str = "127.0.0.1"
    """Where the router listens (clients send their requests there)."""

    port: int = Field(default=0, ge=0, le=65535)
    """The router's port; 0 picks a free one, recorded in the canary's state and the task log."""

    timeout_s: float = Field(default=10.0, gt=0.0)
    """How long the router waits for a model's answer before counting the request as an error."""


class SageMakerServing(Section):
    """`backend: sagemaker`: two production variants of one SageMaker endpoint, weights shifted."""

    endpoint_name: str = Field(min_length=1, max_length=63, pattern=r"^[a-zA-Z0-9](-*[a-zA-Z0-9])*$")
    """The endpoint serving both models (deployed beforehand, one production variant each)."""

    champion_variant: str = Field(default="champion", min_length=1, max_length=63)
    """The production variant serving the champion."""

    candidate_variant: str = Field(default="canary", min_length=1, max_length=63)
    """The production variant serving the candidate."""

    aws_conn_id: str = "aws_default"
    """Airflow connection of the AWS account (the amazon provider's `aws` type)."""

    alarms: list[str] = []
    """CloudWatch alarms watched at every step: one in ALARM fails the step, whatever the figures."""


class CanarySection(Section):
    """Canary release: the gate's winner takes a growing share of live traffic, step by step."""

    steps: list[float] = Field(default=[5.0, 25.0, 100.0], min_length=1)
    """Percent of traffic on the candidate at each step, increasing, each in (0, 100]. The champion
    keeps the rest, and scores every request in the shadow for the comparison."""

    step_duration: PositiveDuration = timedelta(minutes=10)
    """How long each step lasts: a check that fails with confidence ends it early; otherwise it is
    judged at its end."""

    checks: CanaryChecks = CanaryChecks()
    """What every step must satisfy."""

    alias: Alias = "canary"
    """The alias the candidate holds while it is in canary (removed when it is promoted or rolled back)."""

    backend: Literal["local", "sagemaker"] = "local"
    """Where both models serve: `local` (`mlflow models serve` x2 and a weighted router here) or
    `sagemaker` (two production variants of an endpoint; figures and alarms from CloudWatch)."""

    local: LocalServing = LocalServing()
    """Settings of the local backend."""

    sagemaker: SageMakerServing | None = None
    """Settings of the SageMaker backend (required with `backend: sagemaker`)."""

    poll_interval: PositiveDuration = timedelta(seconds=30)
    """How often a waiting step (in the triggerer) reads its checks."""

    confidence: float = Field(default=0.95, ge=0.5, lt=1.0)
    """Each check decides on an interval at this confidence, not on its figure alone: it fails
    once the interval is above its threshold, holds once it is below, and until then the step
    keeps collecting (docs/canary.md has the requests each needs)."""

    undecided: Literal["fail", "hold"] = "fail"
    """What a check still undecided when its step ends does: `fail` (nothing is promoted on doubt)
    or `hold`. The report says `undecided at N requests` either way."""

    @model_validator(mode="after")
    def _increasing_steps(self) -> CanarySection:
        problems: FieldProblems = []
        for index, share in enumerate(self.steps):
            if not 0.0 < share <= 100.0:
                problems.append((("steps", index), f"must be a percent in (0, 100], got {share:g}"))
            elif index and share <= self.steps[index - 1]:
                problems.append(
                    (("steps", index), f"must be above the step before ({self.steps[index - 1]:g})")
                )
        if self.poll_interval > self.step_duration:
            problems.append((("poll_interval",), "must not be longer than step_duration"))
        if self.backend == "sagemaker":
            if self.sagemaker is None:
                problems.append(
                    (("sagemaker",), "backend sagemaker needs its endpoint: add sagemaker.endpoint_name")
                )
            # A production variant answers a request alone: nothing scores it twice to compare.
            for check in ("max_disagreement", "max_score_distance"):
                if getattr(self.checks, check) is not None:
                    problems.append(
                        (
                            ("checks", check),
                            "SageMaker variants never score one request twice: set it to null",
                        )
                    )
        field_problems(problems)
        return self


def canary_fit_problems(
    canary: CanarySection | None, registration: RegisterSection, task: Task
) -> FieldProblems:
    """The canary holds an alias the register section never moves, and checks what the task can decide."""
    if canary is None:
        return []
    problems: FieldProblems = []
    taken = {registration.alias, registration.previous_alias}
    if registration.approval == "required":
        taken.add(registration.staging_alias)
    if canary.alias in taken:
        problems.append(
            (
                ("canary", "alias"),
                f"must differ from the register section's aliases {sorted(a for a in taken if a)}",
            )
        )
    if canary.checks.max_disagreement is not None and task not in (
        "binary_classification",
        "multiclass_classification",
    ):
        problems.append(
            (
                ("canary", "checks", "max_disagreement"),
                f"a {task} model makes no decision to disagree on: set it to null "
                "and compare scores with max_score_distance",
            )
        )
    return problems
