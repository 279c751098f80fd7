"""Ranking metrics: per query (group), the rows in score order against their relevance.

Each metric is a mean over the groups that hold at least one relevant row (relevance > 0): a
query where nothing is relevant orders nothing that matters, and would score 0 (sklearn's
`ndcg_score`) or 1 (LightGBM) by convention for every model alike. Gains are linear in the
relevance, as `sklearn.metrics.ndcg_score` has them. Rows of equal score keep their holdout order.

- `ndcg_at_k`: DCG of the top k over the DCG of the ideal order's top k; `ndcg`: the whole list.
- `map_at_k`: over the top k, the precision at each relevant row, divided by min(k, relevant
  rows of the group); `map`: the whole list.
- `mrr`: 1 / the rank of the first relevant row.

`per_group` gives every group's values, so the bootstrap (runtime/evaluation/confidence.py) resamples
groups without scoring again: each metric is the mean of its per-group values.
"""

from __future__ import annotations

import numpy as np

from airflow_trainpipe.config.catalog import MAP_CUTOFFS, NDCG_CUTOFFS


def per_group(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> dict[str, np.ndarray]:
    """Each ranking metric per scored group, the groups in ascending code order."""
    by_score = np.lexsort((-scores, groups))  # stable: ties keep their holdout order
    relevance, code = labels[by_score], groups[by_score]
    ideal = labels[np.lexsort((-labels, groups))]  # the same groups in the same order, best first
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]]) if len(code) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, len(code)])
    group = np.repeat(np.arange(len(starts)), sizes)
    rank = np.arange(len(code)) - np.repeat(starts, sizes)  # 0-based position within the group
    discount = 1.0 / np.log2(rank + 2.0)
    hit = relevance > 0
    relevant = np.bincount(group, hit, len(starts))
    scored = relevant > 0
    result: dict[str, np.ndarray] = {}
    for k in (*NDCG_CUTOFFS, None):
        top = rank < k if k is not None else np.ones(len(rank), bool)
        dcg = np.bincount(group, relevance * discount * top, len(starts))
        ideal_dcg = np.bincount(group, ideal * discount * top, len(starts))
        result["ndcg" if k is None else f"ndcg_at_{k}"] = dcg[scored] / ideal_dcg[scored]
    hits_so_far: np.ndarray = np.cumsum(hit) - np.repeat(np.cumsum(hit)[starts] - hit[starts], sizes)
    precision = hits_so_far / (rank + 1.0)
    for k in (*MAP_CUTOFFS, None):
        top = rank < k if k is not None else np.ones(len(rank), bool)
        summed = np.bincount(group, precision * hit * top, len(starts))
        denominator = relevant if k is None else np.minimum(relevant, k)
        result["map" if k is None else f"map_at_{k}"] = summed[scored] / denominator[scored]
    first = np.full(len(starts), np.inf)
    rows = np.flatnonzero(hit)
    found, at = np.unique(group[rows], return_index=True)
    first[found] = rank[rows[at]]
    result["mrr"] = 1.0 / (first[scored] + 1.0)
    return result


def ranking_metrics(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    """The means of `per_group`; NaN when no group holds a relevant row."""
    return {
        name: float(values.mean()) if len(values) else float("nan")
        for name, values in per_group(labels, scores, groups).items()
    }
