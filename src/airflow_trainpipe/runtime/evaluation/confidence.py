"""How sure the gate can be that the candidate beats the champion: a paired bootstrap.

Both models' predictions of the same holdout rows are resampled together (the same rows drawn
for both, with replacement), the primary metric is computed for each model on each resample, and
the improvement's distribution gives a percentile interval. Pairing matters: the rows that are
hard for one model are mostly hard for the other, and resampling them together cancels that
shared noise, so a real improvement shows as significant on a holdout where two independent
intervals would overlap.

A ranking holdout is resampled by query (group), not by row: a query's rows are one unit of
evidence, and each ranking metric is a mean of per-query values, so a resample is a mean of those
values drawn with replacement, computed once per model rather than rescored.

Cost: two metric computations per resample. Above `MAX_ROWS` holdout rows each resample draws
`MAX_ROWS` of them (an m-out-of-n bootstrap): its interval is that of a holdout of `MAX_ROWS`
rows, wider than the whole holdout's, so the gate errs towards "not significant", never towards
a promotion by noise.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics
from airflow_trainpipe.runtime.evaluation.ranking import per_group

MAX_ROWS = 200_000


def improvement_interval(
    task: str,
    metric: str,
    direction: str,
    labels: np.ndarray,
    candidate: tuple[np.ndarray, Any],
    champion: tuple[np.ndarray, Any],
    *,
    confidence: float,
    samples: int,
    seed: int,
    groups: np.ndarray | None = None,
) -> tuple[float, float]:
    """The `confidence` interval of the improvement (candidate minus champion, sign-flipped for a
    metric to minimise: better is > 0). `candidate` / `champion`: (predictions, threshold), the
    threshold each model's class metrics used on the whole holdout, kept for every resample.
    `groups` (ranking): each row's query.

    A resample where the metric is undefined (one class drawn, for ROC AUC) is drawn again; a
    holdout where that keeps happening has no interval: (-inf, inf), which nothing clears.
    """
    rng = np.random.default_rng([seed, len(labels)])
    sign = 1.0 if direction == "maximize" else -1.0
    if groups is not None:
        return _by_group(metric, sign, labels, candidate[0], champion[0], groups, rng, confidence, samples)
    rows = min(len(labels), MAX_ROWS)
    improvements: list[float] = []
    draws = 0
    while len(improvements) < samples and draws < 2 * samples:
        draws += 1
        index = rng.integers(0, len(labels), rows)
        theirs = compute_metrics(task, labels[index], champion[0][index], threshold=champion[1])[metric]
        ours = compute_metrics(task, labels[index], candidate[0][index], threshold=candidate[1])[metric]
        if math.isfinite(ours) and math.isfinite(theirs):
            improvements.append(sign * (ours - theirs))
    if len(improvements) < samples:
        return (-math.inf, math.inf)
    return _percentiles(np.asarray(improvements), confidence)


def _by_group(
    metric: str,
    sign: float,
    labels: np.ndarray,
    ours: np.ndarray,
    theirs: np.ndarray,
    groups: np.ndarray,
    rng: np.random.Generator,
    confidence: float,
    samples: int,
) -> tuple[float, float]:
    # Both models score the same queries in the same order: their per-query values pair up.
    gains = sign * (per_group(labels, ours, groups)[metric] - per_group(labels, theirs, groups)[metric])
    if len(gains) < 2:
        return (-math.inf, math.inf)
    drawn = min(len(gains), MAX_ROWS)
    improvements = np.array([gains[rng.integers(0, len(gains), drawn)].mean() for _ in range(samples)])
    return _percentiles(improvements, confidence)


def _percentiles(improvements: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1 - confidence) / 2
    low, high = np.quantile(improvements, [tail, 1 - tail])
    return float(low), float(high)
