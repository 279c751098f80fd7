"""Fit the declared transforms on training rows, batch by batch, in bounded memory.

Pass 1 collects per numeric column its moments and (when a clip or a median is declared) a
quantile sketch, and per vocabulary column its value counts. When a column clips, its scaling
statistics must be those of the clipped values, so a second pass over the training rows
recomputes its moments with the clip bounds of pass 1. Only training rows are ever fed in:
the caller splits each batch first (runtime.data). A multiclass label's classes are the values
its training rows hold.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.features import FeaturesSection
from airflow_trainpipe.runtime.data.reader import DataError
from airflow_trainpipe.runtime.data.sketch import Moments, QuantileSketch
from airflow_trainpipe.runtime.data.transform import (
    FORMAT,
    FittedTransform,
    as_strings,
    prepare_numeric,
)

MAX_CLASSES = 1000


class TransformFitter:
    def __init__(self, data: DataSection, features: FeaturesSection, task: str):
        self.data, self.task = data, task
        self.numeric = {name: features.numeric_transform(name) for name in data.features.numeric}
        self.categorical = {name: features.categorical_transform(name) for name in data.features.categorical}
        self.moments = {name: Moments() for name in self.numeric}
        self.clipped_moments = {name: Moments() for name, t in self.numeric.items() if t.clip is not None}
        self.sketches = {
            name: QuantileSketch()
            for name, t in self.numeric.items()
            if t.clip is not None or t.fill == "median"
        }
        self.counts: dict[str, dict[str, int]] = {
            name: {} for name, t in self.categorical.items() if t.encode != "hash"
        }
        self.source_types: dict[str, str] = {}
        self.label = Moments()
        self.classes: dict[str, int] = {}
        self.integer_classes = True
        self.bounds: dict[str, tuple[float, float]] = {}

    @property
    def needs_second_pass(self) -> bool:
        return bool(self.clipped_moments)

    def update(self, train: pa.Table) -> None:
        """Pass 1 over one batch of training rows."""
        for name, transform in self.numeric.items():
            values = prepare_numeric(train.column(name), name, transform.log1p)
            finite = values[~np.isnan(values)]
            self.moments[name].update(finite)
            if name in self.sketches:
                self.sketches[name].update(finite)
        for name in self.categorical:
            column = train.column(name)
            self.source_types.setdefault(name, "long" if pa.types.is_integer(column.type) else "string")
            if name in self.counts:
                counts = self.counts[name]
                for entry in pc.value_counts(as_strings(column)).to_pylist():
                    if entry["values"] is not None:
                        counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
        label = train.column(self.data.label)
        if self.task == "regression":
            self.label.update(prepare_numeric(label, self.data.label, log1p=False))
        elif self.task == "multiclass_classification":
            self.integer_classes &= pa.types.is_integer(label.type)
            for entry in pc.value_counts(as_strings(label)).to_pylist():
                self.classes[entry["values"]] = self.classes.get(entry["values"], 0) + entry["counts"]
            if len(self.classes) > MAX_CLASSES:
                raise DataError(
                    f"label column {self.data.label!r} has more than {MAX_CLASSES} classes; "
                    "a multiclass model predicts one probability per class"
                )
        elif self.task == "ranking" and len(label) and pc.min(label.cast(pa.float64())).as_py() < 0:
            raise DataError(
                f"label column {self.data.label!r} holds a negative relevance; ranking needs 0 or more"
            )

    def start_second_pass(self) -> None:
        for name in self.clipped_moments:
            clip = self.numeric[name].clip
            assert clip is not None  # clipped_moments holds the clipped columns only
            low, high = self.sketches[name].quantiles([clip.lower, clip.upper])
            if low is not None and high is not None:
                self.bounds[name] = (low, high)

    def update_clipped(self, train: pa.Table) -> None:
        """Pass 2 over one batch of training rows: moments of the clipped values."""
        for name, (low, high) in self.bounds.items():
            values = prepare_numeric(train.column(name), name, self.numeric[name].log1p)
            self.clipped_moments[name].update(np.clip(values[~np.isnan(values)], low, high))

    def result(self, text: list[dict[str, Any]] | None = None) -> FittedTransform:
        """The fitted document; `text`: the fitted text inputs (runtime.data.text.TextFitter)."""
        columns = [self._numeric(name) for name in self.numeric] + [
            self._categorical(name) for name in self.categorical
        ]
        label: dict[str, Any] = {"name": self.data.label, "task": self.task, "mean": 0.0, "std": 1.0}
        if self.task == "regression" and self.label.count:
            label.update(mean=self.label.mean, std=self.label.std if self.label.std > 1e-12 else 1.0)
        if self.task == "ranking":
            label["group"] = self.data.group
        if self.task == "multiclass_classification":
            if len(self.classes) < 2:
                raise DataError(
                    f"label column {self.data.label!r} holds {len(self.classes)} class(es) in the training "
                    "rows; a multiclass model needs at least 2"
                )
            order = (lambda c: (int(c), c)) if self.integer_classes else None
            label["classes"] = sorted(self.classes, key=order)
        document: dict[str, Any] = {"format": FORMAT, "columns": columns, "label": label}
        if text:
            document["text"] = text
        return FittedTransform(document)

    def _numeric(self, name: str) -> dict[str, Any]:
        transform = self.numeric[name]
        bounds = self.bounds.get(name)
        moments = self.clipped_moments[name] if bounds else self.moments[name]
        fill: float | None
        if transform.fill == "mean":
            fill = moments.mean if moments.count else 0.0
        elif transform.fill == "median":
            median = self.sketches[name].quantiles([0.5])[0]
            fill = 0.0 if median is None else float(np.clip(median, *bounds)) if bounds else median
        elif transform.fill == "zero":
            fill = 0.0
        else:
            fill = None
        center, scale = 0.0, 1.0
        if transform.scale == "standardize" and moments.count:
            center, scale = moments.mean, moments.std
        elif transform.scale == "min_max" and moments.count:
            center, scale = moments.min, moments.max - moments.min
        return {
            "name": name,
            "kind": "numeric",
            "log1p": transform.log1p,
            "clip": list(bounds) if bounds else None,
            "fill": fill,
            "center": center,
            "scale": scale if scale > 1e-12 else 1.0,
            "missing_indicator": transform.missing_indicator,
            "optional": transform.optional,
        }

    def _categorical(self, name: str) -> dict[str, Any]:
        transform = self.categorical[name]
        fitted: dict[str, Any] = {
            "name": name,
            "kind": "categorical",
            "encode": transform.encode,
            "missing": transform.missing,
            "missing_indicator": transform.missing_indicator,
            "optional": transform.optional,
            "source_type": self.source_types.get(name, "string"),
        }
        if transform.encode == "hash":
            fitted["buckets"] = transform.buckets
        else:
            ranked = sorted(self.counts[name].items(), key=lambda item: (-item[1], item[0]))
            kept = ranked[: transform.max_categories] if transform.max_categories else ranked
            fitted["categories"] = sorted(value for value, _ in kept)
        return fitted
