"""Per-feature distribution profiles and drift scores, built in one streaming pass.

A profile is what a later snapshot is compared with, so the reference data never has to be
read again:
- numeric: the 99 percentiles of the non-null values and the exact share of values at or below
  each; the percentiles come from a deterministic strided sample of at most SAMPLE_ROWS values
  (the whole column when it is smaller), so memory stays bounded;
- categorical: the count of each value (the MAX_CATEGORIES most frequent; the rest as one bucket).
Scores:
- PSI over the reference's deciles (numeric) or categories, with EPSILON for empty bins;
- KS: the largest gap between the two CDFs at the reference's percentiles. Between two
  percentiles the reference CDF moves by about 1%, so this D is at most ~0.01 below the exact one;
- chi2: Cramer's V of the 2 x k contingency table (0 = same mix, 1 = disjoint).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SAMPLE_ROWS = 200_000
PERCENTILES = np.arange(1, 100) / 100
DECILE_INDEX = np.arange(9, 99, 10)  # positions of the 10th..90th percentiles among the 99
MAX_CATEGORIES = 1000
OTHER = "__other__"
EPSILON = 1e-4


class NumericAccumulator:
    """Collects a strided sample while the batches stream by; counts at reference edges exactly."""

    def __init__(self, total_rows: int, reference_edges: np.ndarray | None) -> None:
        """`reference_edges`: the edges this snapshot is counted at (the reference's deciles for
        PSI, all its percentiles for KS); None when there is no reference."""
        self.stride = max(1, -(-total_rows // SAMPLE_ROWS))
        self.offset = 0
        self.samples: list[np.ndarray] = []
        self.nulls = 0
        self.count = 0
        self.edges = reference_edges
        self.at_or_below = (
            np.zeros(len(reference_edges), dtype=np.int64) if reference_edges is not None else None
        )

    def add(self, column: pa.Array | pa.ChunkedArray) -> None:
        self.nulls += column.null_count
        values = pc.drop_null(column).to_numpy(zero_copy_only=False).astype(np.float64, copy=False)
        self.count += len(values)
        # Stride over the concatenation of all batches, not per batch: the sample is the same
        # whatever the batch size.
        self.samples.append(values[self.offset :: self.stride].copy())
        self.offset = (self.offset - len(values)) % self.stride
        if self.at_or_below is not None and self.edges is not None:
            for i, edge in enumerate(self.edges):
                self.at_or_below[i] += int(np.count_nonzero(values <= edge))

    def profile(self) -> dict[str, Any]:
        sample = np.sort(np.concatenate(self.samples)) if self.samples else np.empty(0)
        if len(sample) == 0:
            return {"kind": "numeric", "count": 0, "nulls": self.nulls, "edges": [], "cdf": []}
        edges = sample[
            np.floor(PERCENTILES * (len(sample) - 1)).astype(np.int64)
        ]  # method="lower", sorted once
        cdf = np.searchsorted(sample, edges, side="right") / len(sample)
        return {
            "kind": "numeric",
            "count": self.count,
            "nulls": self.nulls,
            "edges": edges.tolist(),
            "cdf": cdf.tolist(),
        }

    def cdf_at_reference(self) -> np.ndarray:
        if self.at_or_below is None:
            raise ValueError("no reference edges: this column has no reference profile to compare with")
        return np.asarray(self.at_or_below / max(self.count, 1))


class TextAccumulator(NumericAccumulator):
    """A text column's profile: its length in words (drift is scored on it, as on a numeric
    column), plus the rows that are null or blank and the longest text in characters."""

    def __init__(self, total_rows: int, reference_edges: np.ndarray | None) -> None:
        super().__init__(total_rows, reference_edges)
        self.blank = 0
        self.rows = 0
        self.longest = 0

    def add(self, column: pa.Array | pa.ChunkedArray) -> None:
        text = pc.fill_null(column, "")
        self.rows += len(text)
        self.blank += int(pc.sum(pc.equal(pc.utf8_trim_whitespace(text), "")).as_py() or 0)
        self.longest = max(self.longest, int(pc.max(pc.utf8_length(text)).as_py() or 0))
        super().add(pc.list_value_length(pc.utf8_split_whitespace(text)))

    def profile(self) -> dict[str, Any]:
        return {
            **super().profile(),
            "kind": "text",
            "blank": self.blank,
            "rows": self.rows,
            "longest": self.longest,
        }


class CategoricalAccumulator:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.nulls = 0

    def add(self, column: pa.Array | pa.ChunkedArray) -> None:
        self.nulls += column.null_count
        for item in pc.value_counts(pc.drop_null(column)).to_pylist():
            key = str(item["values"])
            self.counts[key] = self.counts.get(key, 0) + item["counts"]

    def profile(self) -> dict[str, Any]:
        ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kept = dict(ranked[:MAX_CATEGORIES])
        rest = sum(count for _, count in ranked[MAX_CATEGORIES:])
        if rest:
            kept[OTHER] = kept.get(OTHER, 0) + rest
        return {
            "kind": "categorical",
            "count": sum(self.counts.values()),
            "nulls": self.nulls,
            "counts": kept,
        }


def _psi(expected: np.ndarray, actual: np.ndarray) -> float:
    expected = np.clip(expected, EPSILON, None)
    actual = np.clip(actual, EPSILON, None)
    return float(np.sum((actual - expected) * np.log(actual / expected)))


def _masses(cdf: np.ndarray) -> np.ndarray:
    """Bin masses from a CDF at increasing edges: below the first, between each pair, above the last."""
    return np.diff(np.concatenate([[0.0], cdf, [1.0]]))


@dataclass
class DriftScore:
    feature: str
    method: str
    score: float
    threshold: float
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def drifted(self) -> bool:
        return self.score > self.threshold


def reference_edges(method: str, reference: dict[str, Any]) -> np.ndarray:
    """Where the current snapshot must be counted: PSI needs the deciles only, KS every percentile."""
    edges = np.asarray(reference["edges"])
    return edges if method == "ks" else edges[DECILE_INDEX]


def numeric_score(method: str, reference: dict[str, Any], current: NumericAccumulator) -> float:
    ref_cdf = np.asarray(reference["cdf"])
    cur_cdf = current.cdf_at_reference()
    if method == "ks":
        return float(np.max(np.abs(ref_cdf - cur_cdf))) if len(ref_cdf) else 0.0
    return _psi(_masses(ref_cdf[DECILE_INDEX]), _masses(cur_cdf))


def categorical_score(method: str, reference: dict[str, Any], current: dict[str, Any]) -> float:
    categories = sorted(set(reference["counts"]) | set(current["counts"]))
    ref = np.array([reference["counts"].get(c, 0) for c in categories], dtype=np.float64)
    cur = np.array([current["counts"].get(c, 0) for c in categories], dtype=np.float64)
    if ref.sum() == 0 or cur.sum() == 0:
        return 0.0
    if method == "psi":
        return _psi(ref / ref.sum(), cur / cur.sum())
    table = np.vstack([ref, cur])
    table = table[:, table.sum(axis=0) > 0]
    if table.shape[1] < 2:
        return 0.0
    # Pearson's chi-square of the 2 x k table (scipy's chi2_contingency without continuity
    # correction); numpy only, since importing scipy.stats alone costs seconds.
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    chi2 = float(np.sum((table - expected) ** 2 / expected))
    return float(np.sqrt(chi2 / table.sum()))  # Cramer's V with two rows: min(r, c) - 1 = 1
