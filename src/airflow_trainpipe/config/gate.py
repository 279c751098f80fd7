"""`gate`: when a candidate may replace the champion, decided on the same holdout."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat

from airflow_trainpipe.config.base import FieldProblems, Section
from airflow_trainpipe.config.catalog import METRICS, Direction, Task
from airflow_trainpipe.config.evaluation import EvaluationSection
from airflow_trainpipe.config.suggest import did_you_mean


class Guardrail(Section):
    """A secondary metric the candidate may not worsen by more than allowed."""

    metric: str
    """Metric name (see the metrics of `training.task`)."""

    max_regression: NonNegativeFloat = 0.0
    """Largest absolute worsening vs the champion, in the metric's own units."""

    max_relative_regression: NonNegativeFloat | None = None
    """Largest relative worsening vs the champion (0.02 = 2%); both limits apply when set."""

    @property
    def absolute_limit(self) -> float | None:
        """The absolute limit in force: max_regression when written in the config or when no
        relative limit is set; a relative limit alone replaces the default 0.0."""
        if "max_regression" in self.model_fields_set or self.max_relative_regression is None:
            return self.max_regression
        return None


class SliceGuardrail(Section):
    """No slice of `evaluation.slices` with enough rows may regress beyond a bound."""

    metric: str | None = None
    """Metric compared per slice; default: the gate's primary metric."""

    max_regression: NonNegativeFloat = 0.0
    """Largest worsening vs the champion allowed on any slice, in the metric's units."""

    min_rows: int = Field(default=100, ge=1)
    """Slices with fewer holdout rows are reported but not held to the bound (too noisy)."""


class NoChampionPolicy(Section):
    """What the first run does, when no model holds the champion alias yet."""

    action: Literal["promote", "skip", "fail"] = "promote"
    """`promote` the candidate, `skip` registration, or `fail` the run."""

    min_value: float | None = None
    """Promote only if the primary metric reaches this value (in the metric's better direction)."""


class GateSection(Section):
    """Candidate vs champion, both scored on this run's holdout by the same code."""

    metric: str
    """Primary metric, e.g. `roc_auc` or `rmse`."""

    direction: Direction | None = None
    """`maximize` or `minimize`; defaults to the metric's natural direction, which it must match."""

    min_improvement: NonNegativeFloat = 0.0
    """Smallest absolute improvement of the primary metric that justifies a promotion."""

    min_relative_improvement: NonNegativeFloat = 0.0
    """Smallest relative improvement (0.01 = 1%); both minimums apply."""

    guardrails: list[Guardrail] = []
    """Metrics that may not regress beyond their limits."""

    no_champion: NoChampionPolicy = NoChampionPolicy()
    """Bootstrap policy for the first run."""

    slice_guardrail: SliceGuardrail | None = None
    """Block a candidate that is better overall but worse on a slice (`evaluation.slices`)."""

    confidence: float | None = Field(default=None, gt=0.5, lt=1)
    """Promote only when the improvement is significant: a seeded paired bootstrap of candidate vs
    champion over the same holdout rows gives a `confidence` interval (0.95: 95%) of the primary
    metric's improvement, and its lower bound must clear `min_improvement` (and be above 0). A
    tie, or a holdout too small to tell, is "not significant". null: the point values decide."""

    bootstrap_samples: int = Field(default=1000, ge=100, le=100_000)
    """Resamples of the holdout for `confidence` (each rescores both models' predictions)."""

    bootstrap_seed: int = Field(default=0, ge=0)
    """Seed of the resamples: the same holdout and predictions give the same interval."""


def gate_metric_problems(gate: GateSection, task: Task) -> FieldProblems:
    """The gate decides on metrics of the task, each in its own direction, the primary one once."""
    problems: FieldProblems = []
    metrics = METRICS[task]
    if gate.metric not in metrics:
        problems.append(
            (
                ("gate", "metric"),
                f"{gate.metric!r} is not a {task} metric"
                f"{did_you_mean(gate.metric, metrics)}; expected one of {', '.join(metrics)}",
            )
        )
    elif gate.direction and gate.direction != metrics[gate.metric]:
        problems.append(
            (
                ("gate", "direction"),
                f"{gate.metric} is better when it is "
                f"{'higher' if metrics[gate.metric] == 'maximize' else 'lower'}; "
                f"direction must be {metrics[gate.metric]!r}, got {gate.direction!r}",
            )
        )
    for i, guardrail in enumerate(gate.guardrails):
        if guardrail.metric not in metrics:
            problems.append(
                (
                    ("gate", "guardrails", i, "metric"),
                    f"{guardrail.metric!r} is not a {task} metric"
                    f"{did_you_mean(guardrail.metric, metrics)}; expected one of {', '.join(metrics)}",
                )
            )
        elif guardrail.metric == gate.metric:
            problems.append(
                (("gate", "guardrails", i, "metric"), "the primary metric cannot also be a guardrail")
            )
    return problems


def slice_guardrail_problems(gate: GateSection, task: Task, evaluation: EvaluationSection) -> FieldProblems:
    """The slice guardrail compares a metric of the task, on slices that `evaluation` defines."""
    guardrail = gate.slice_guardrail
    if guardrail is None:
        return []
    problems: FieldProblems = []
    metrics = METRICS[task]
    if guardrail.metric is not None and guardrail.metric not in metrics:
        problems.append(
            (
                ("gate", "slice_guardrail", "metric"),
                f"{guardrail.metric!r} is not a {task} metric"
                f"{did_you_mean(guardrail.metric, metrics)}; expected one of {', '.join(metrics)}",
            )
        )
    if not evaluation.slices:
        problems.append((("gate", "slice_guardrail"), "there are no evaluation.slices to guard"))
    return problems
