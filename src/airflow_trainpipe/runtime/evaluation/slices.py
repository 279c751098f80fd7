"""The final evaluation per slice (`evaluation.slices`): both models' metrics on each slice's rows.

A model better overall can be worse for one channel or one country; the gate's slice guardrail
(`registry/promotion.py`) decides on these numbers. Each model keeps the threshold it was given on the
whole holdout: a slice is scored as that model would serve it, not at a threshold fitted to the
slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics

if TYPE_CHECKING:
    from airflow_trainpipe.config.evaluation import Slice

MISSING = "(missing)"


def slice_names(tables: Iterable[pa.Table], spec: Slice) -> np.ndarray:
    """Each holdout row's slice within `spec` (`channel` -> `web`; `amount` with bins -> `[10, 100)`;
    a text column with bins, by its length in characters -> `[0, 200)`)."""
    parts = [_names(table.column(spec.column), spec.bins) for table in tables]
    return np.concatenate(parts) if parts else np.empty(0, dtype=object)


def _names(column: pa.ChunkedArray, bins: list[float] | None) -> np.ndarray:
    if bins is None:
        return np.asarray(pc.fill_null(pc.cast(column, pa.string()), MISSING).to_numpy(zero_copy_only=False))
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = pc.utf8_length(column)  # a text column is sliced by its length in characters
    values = np.asarray(pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False), dtype=np.float64)
    labels = np.array(
        [f"< {bins[0]:g}", *(f"[{a:g}, {b:g})" for a, b in pairwise(bins)), f">= {bins[-1]:g}"], dtype=object
    )
    names = labels[np.digitize(values, bins)]
    names[np.isnan(values)] = MISSING  # digitize puts NaN past the last edge
    return names


def slice_scores(
    task: str,
    specs: list[Slice],
    tables: Any,
    labels: np.ndarray,
    candidate: tuple[np.ndarray, float],
    champion: tuple[np.ndarray, float] | None,
    groups: np.ndarray | None = None,
    classes: list[str] | None = None,
) -> list[dict[str, Any]]:
    """One entry per slice, in config order and by name within a column. `tables`: a function
    returning the holdout's tables in the order the predictions were made. A ranking slice ranks
    each query's rows that fall in the slice."""
    scores = []
    for spec in specs:
        names = slice_names(tables(), spec)
        for name in sorted(set(names.tolist())):
            rows = names == name
            extra: dict[str, Any] = {"groups": None if groups is None else groups[rows], "classes": classes}
            scores.append(
                {
                    "slice": f"{spec.column}={name}",
                    "rows": int(rows.sum()),
                    "candidate": compute_metrics(
                        task, labels[rows], candidate[0][rows], threshold=candidate[1], **extra
                    ),
                    "champion": None
                    if champion is None
                    else compute_metrics(
                        task, labels[rows], champion[0][rows], threshold=champion[1], **extra
                    ),
                }
            )
    return scores
