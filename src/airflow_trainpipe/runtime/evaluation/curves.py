"""ROC and precision-recall curves of a binary model's holdout scores, thinned for a report.

The gate's report (registry/gate_report.py) draws both models' curves from these points, which the final
evaluation writes to evaluation.json: at most `points` of each curve, taken evenly over the
distinct thresholds (the curve's shape, in a few KiB, whatever the holdout's size).
"""

from __future__ import annotations

import numpy as np


def binary_curves(
    labels: np.ndarray, scores: np.ndarray, points: int = 200
) -> dict[str, list[list[float]]] | None:
    """{"roc": [[fpr, tpr], ...], "pr": [[recall, precision], ...]}, thresholds descending;
    None when the holdout lacks a class (neither curve is defined)."""
    positive = np.asarray(labels) == 1
    if positive.all() or not positive.any():
        return None
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    ranked = np.asarray(scores, dtype=np.float64)[order]
    last_of_each = np.r_[np.flatnonzero(np.diff(ranked)), len(ranked) - 1]  # one point per threshold
    true = np.cumsum(positive[order])[last_of_each]
    false = last_of_each + 1 - true
    keep = np.unique(
        np.linspace(0, len(last_of_each) - 1, min(points, len(last_of_each))).round().astype(int)
    )
    true, false = true[keep], false[keep]
    tpr, fpr = true / true[-1], false / false[-1]
    precision = true / (true + false)
    return {
        "roc": [
            [0.0, 0.0],
            *([round(float(f), 5), round(float(t), 5)] for f, t in zip(fpr, tpr, strict=True)),
        ],
        "pr": [[round(float(r), 5), round(float(p), 5)] for r, p in zip(tpr, precision, strict=True)],
    }
