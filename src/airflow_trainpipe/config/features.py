"""`features`: the declared transforms from raw columns to model inputs.

Only the transform names below exist; a config chooses and parameterises them, it never holds
an expression or code. The runtime fits them on the training split and ships the fitted
document inside the logged model, so training, evaluation and serving apply the same logic.
Columns of `data.features` without an entry here get the default of their kind; text columns'
tokenizers are `features.text` (config.text).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PositiveInt, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.data import FeatureColumns
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.config.text import TextTransform
from airflow_trainpipe.config.types import ColumnName


class QuantileClip(Section):
    """Clip values to quantiles of the training split (after `log1p`), fitted once per run."""

    lower: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Lower quantile (0: no lower bound)."""

    upper: float = Field(default=1.0, gt=0.0, le=1.0)
    """Upper quantile (1: no upper bound)."""

    @model_validator(mode="after")
    def _ordered(self) -> QuantileClip:
        if self.lower >= self.upper:
            field_problems(
                [(("upper",), f"upper quantile {self.upper} must be above lower quantile {self.lower}")]
            )
        return self


class NumericTransform(Section):
    """One numeric column: `log1p`, then `clip`, then `fill`, then `scale`, in that order."""

    log1p: bool = False
    """Apply log(1 + x) first; values at or below -1 count as missing."""

    clip: QuantileClip | None = None
    """Clip to quantiles of the training split; null: no clipping."""

    fill: Literal["mean", "median", "zero", "error"] = "mean"
    """Value for a missing (null, NaN, infinite) entry: a training-split statistic, `zero`, or `error` to refuse the row set."""

    scale: Literal["standardize", "min_max", "none"] = "standardize"
    """`standardize` (z-score), `min_max` (to [0, 1] on the training range) or `none`."""

    missing_indicator: bool = False
    """Add a 0/1 model input that says the value was missing."""

    optional: bool = False
    """Rows to score may lack this column (every value then counts as missing); training data must have it."""

    @model_validator(mode="after")
    def _optional_needs_fill(self) -> NumericTransform:
        if self.optional and self.fill == "error":
            field_problems(
                [
                    (
                        ("fill",),
                        "an optional column is all missing when absent; choose a fill other than 'error'",
                    )
                ]
            )
        return self


class CategoricalTransform(Section):
    """One categorical column: values are compared as strings."""

    encode: Literal["index", "one_hot", "hash"] = "index"
    """`index`: vocabulary index for an embedding (0 = unknown or missing); `one_hot`: one input per kept
    value plus an `other` input; `hash`: embedding index from a stable hash into `buckets` (no vocabulary)."""

    max_categories: PositiveInt | None = None
    """`index`, `one_hot`: keep the most frequent training values (ties by value); the rest are unknown / other.
    Required for `one_hot`."""

    buckets: PositiveInt | None = None
    """`hash`: number of hash buckets (required)."""

    missing: Literal["unknown", "error"] = "unknown"
    """A missing value is treated as an unknown category, or refused (`error`)."""

    missing_indicator: bool = False
    """Add a 0/1 model input that says the value was missing."""

    optional: bool = False
    """Rows to score may lack this column (every value then counts as missing); training data must have it."""

    @model_validator(mode="after")
    def _parameters_fit_encoding(self) -> CategoricalTransform:
        problems: FieldProblems = []
        if self.encode == "hash":
            if self.buckets is None:
                problems.append((("buckets",), "encode: hash needs `buckets`"))
            if self.max_categories is not None:
                problems.append((("max_categories",), "encode: hash has no vocabulary; use `buckets`"))
        elif self.buckets is not None:
            problems.append((("buckets",), f"`buckets` is for encode: hash, not {self.encode}"))
        if self.encode == "one_hot" and self.max_categories is None:
            problems.append(
                (
                    ("max_categories",),
                    "encode: one_hot needs `max_categories` (kept values; the rest go to `other`)",
                )
            )
        if self.optional and self.missing == "error":
            problems.append(
                (
                    ("missing",),
                    "an optional column is all missing when absent; `missing: error` contradicts it",
                )
            )
        field_problems(problems)
        return self


class FeaturesSection(Section):
    """Per-column transforms of `data.features`; columns not named here get the defaults of their kind."""

    numeric: dict[ColumnName, NumericTransform] = {}
    """Transforms of numeric columns, by column name (default: fill mean, standardize)."""

    categorical: dict[ColumnName, CategoricalTransform] = {}
    """Transforms of categorical columns, by column name (default: encode index)."""

    text: dict[ColumnName, TextTransform] = {}
    """Tokenizers of text columns, by column name (default: a WordPiece of 8000 tokens, lowercased,
    NFKC, 128 tokens a row)."""

    def numeric_transform(self, column: str) -> NumericTransform:
        return self.numeric.get(column) or NumericTransform()

    def categorical_transform(self, column: str) -> CategoricalTransform:
        return self.categorical.get(column) or CategoricalTransform()

    def text_transform(self, column: str) -> TextTransform:
        return self.text.get(column) or TextTransform()


def transform_column_problems(transforms: FeaturesSection, columns: FeatureColumns) -> FieldProblems:
    """Every numeric or categorical transform names a column that `data.features` has, of its kind."""
    problems: FieldProblems = []
    for kind, declared in (("numeric", columns.numeric), ("categorical", columns.categorical)):
        other = columns.categorical if kind == "numeric" else columns.numeric
        for name in getattr(transforms, kind):
            if name in declared:
                continue
            where = (
                f"it is a {'categorical' if kind == 'numeric' else 'numeric'} feature in data.features"
                if name in other
                else f"it is not a {kind} feature in data.features{did_you_mean(name, declared)}"
            )
            problems.append((("features", kind, name), f"no {kind} transform for {name!r}: {where}"))
    return problems
