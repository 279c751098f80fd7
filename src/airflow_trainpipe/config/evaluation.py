"""`evaluation`: how the holdout is scored, beyond the metrics themselves."""

from __future__ import annotations

from itertools import pairwise
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator

from airflow_trainpipe.config.base import FieldProblems, Section
from airflow_trainpipe.config.catalog import Task
from airflow_trainpipe.config.data import FeatureColumns
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.config.types import ColumnName

_THRESHOLD_FORMS = "a number in [0, 1], 'max_f1', or {precision_at: p} with 0 < p <= 1"


class PrecisionAt(Section):
    """The threshold with the most recall among those whose holdout precision is at least `precision_at`."""

    precision_at: float = Field(gt=0, le=1)
    """Smallest acceptable precision (0.9 = at most 1 false alarm in 10 flagged rows)."""


def _threshold_form(value: Any) -> Any:
    """Checked here, whole: a union would report each of its three forms' errors."""
    if value == "max_f1" and isinstance(value, str):
        return value
    if isinstance(value, dict) and set(value) == {"precision_at"}:
        p = value["precision_at"]
        if isinstance(p, int | float) and not isinstance(p, bool) and 0 < p <= 1:
            return PrecisionAt(precision_at=float(p))
        raise ValueError(f"precision_at is a precision, 0 < p <= 1, got {p!r}")
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1:
        return float(value)
    raise ValueError(f"expected {_THRESHOLD_FORMS}, got {value!r}")


ThresholdRule = Annotated[float | Literal["max_f1"] | PrecisionAt, BeforeValidator(_threshold_form)]


class Slice(Section):
    """Holdout rows that share a value of one feature column, each value (or bin) a slice."""

    column: ColumnName
    """A feature column of `data.features`: categorical, or numeric with `bins`."""

    bins: list[float] | None = Field(default=None, min_length=1, max_length=100)
    """Numeric column: ascending edges. A row falls in `[a, b)` between two edges, `< first` or
    `>= last`; a missing value is its own slice, `(missing)`, as for a categorical column."""

    @field_validator("bins")
    @classmethod
    def _ascending(cls, bins: list[float] | None) -> list[float] | None:
        if bins is not None and any(b <= a for a, b in pairwise(bins)):
            raise ValueError(f"bins are strictly ascending edges, got {bins}")
        return bins


class EvaluationSection(Section):
    """Scoring choices the metrics depend on."""

    slices: list[Slice] = Field(default=[], max_length=20)
    """Score candidate and champion on each slice of the holdout too (every metric, at each
    model's threshold of the whole holdout): `[{column: channel}, {column: amount, bins: [10,
    100]}]`. Recorded in the run's evaluation.json; `gate.slice_guardrail` decides on them."""

    threshold: ThresholdRule = 0.5
    """binary_classification: the score at or above which a row counts as positive, for accuracy,
    precision, recall and f1. A number; `max_f1`: the threshold with the best f1 on the holdout;
    `{precision_at: p}`: the one with the most recall at precision >= p (the highest precision
    when none reaches p). A rule is applied to the candidate and to the champion alike, each on its
    own scores of the same holdout rows, and the candidate's threshold is recorded on its model
    version (`trainpipe.threshold`) and carried by the model itself, whose answer's
    `predicted_label` is 1 at or above it (beside `probability`, P(class 1)). The share of rows
    it flags is the metric `predicted_positive_rate`; a threshold that flags every row or none
    promotes nothing on accuracy, precision, recall or f1 (the gate says so)."""


def scoring_problems(evaluation: EvaluationSection, task: Task, columns: FeatureColumns) -> FieldProblems:
    """A threshold only where the task has one, and each slice on a feature column, binned by its kind."""
    problems: FieldProblems = []
    if task != "binary_classification" and evaluation.threshold != 0.5:
        why = {
            "multiclass_classification": "predicts the most probable class",
            "ranking": "orders rows by score",
        }.get(task, "predicts values, not classes")
        problems.append(
            (
                ("evaluation", "threshold"),
                f"a {task} model {why}: a threshold applies to binary_classification only",
            )
        )
    for i, spec in enumerate(evaluation.slices):
        where = ("evaluation", "slices", i)
        if spec.column in columns.numeric and spec.bins is None:
            problems.append(
                ((*where, "bins"), f"numeric column {spec.column!r} is sliced by bins: give edges")
            )
        elif spec.column in columns.categorical and spec.bins is not None:
            problems.append(
                ((*where, "bins"), f"categorical column {spec.column!r} is sliced by value, not bins")
            )
        elif spec.column in columns.text and spec.bins is None:
            problems.append(
                (
                    (*where, "bins"),
                    f"text column {spec.column!r} is sliced by its length: give bins (characters)",
                )
            )
        elif spec.column not in columns.all:
            problems.append(
                (
                    (*where, "column"),
                    f"{spec.column!r} is not a feature column{did_you_mean(spec.column, columns.all)}; "
                    "a slice is read with the features",
                )
            )
    return problems
