"""Ranking metrics per query, held to sklearn's ndcg_score and to a plain per-query loop."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_trainpipe.config.catalog import MAP_CUTOFFS, NDCG_CUTOFFS
from airflow_trainpipe.runtime.evaluation.ranking import per_group, ranking_metrics


def _queries(seed: int, count: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Queries of 1-25 rows in shuffled row order, graded relevance 0-3, scores without ties."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 26, count)
    groups = np.repeat(rng.permutation(count) * 3.0, sizes)
    relevance = np.where(rng.random(len(groups)) < 0.6, 0, rng.integers(1, 4, len(groups))).astype(float)
    scores = 0.4 * relevance + rng.normal(size=len(groups))
    order = rng.permutation(len(groups))
    return relevance[order], scores[order], groups[order]


def _expected(relevance: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> dict[str, float]:
    from sklearn.metrics import ndcg_score

    values: dict[str, list[float]] = {}
    for g in np.unique(groups):
        rows = groups == g
        rel, score = relevance[rows], scores[rows]
        if rel.max() <= 0:
            continue  # nothing relevant: not scored
        for k in (*NDCG_CUTOFFS, None):
            name = "ndcg" if k is None else f"ndcg_at_{k}"
            # sklearn refuses a one-row query; its NDCG is 1 either way
            value = 1.0 if len(rel) == 1 else ndcg_score([rel], [score], k=k)
            values.setdefault(name, []).append(value)
        hit = rel[np.argsort(-score)] > 0
        precision = np.cumsum(hit) / np.arange(1, len(hit) + 1)
        for k in (*MAP_CUTOFFS, None):
            top = len(hit) if k is None else k
            name = "map" if k is None else f"map_at_{k}"
            values.setdefault(name, []).append((precision * hit)[:top].sum() / min(top, hit.sum()))
        values.setdefault("mrr", []).append(1 / (np.argmax(hit) + 1))
    return {name: float(np.mean(v)) for name, v in values.items()}


@pytest.mark.parametrize("seed", range(5))
def test_every_ranking_metric_equals_the_per_query_reference(seed: int) -> None:
    relevance, scores, groups = _queries(seed)
    assert ranking_metrics(relevance, scores, groups) == pytest.approx(
        _expected(relevance, scores, groups), rel=1e-12
    )


def test_a_perfect_order_scores_one_and_the_reverse_less() -> None:
    relevance = np.array([3.0, 2.0, 0.0, 1.0, 0.0])
    groups = np.zeros(5)
    assert set(ranking_metrics(relevance, relevance, groups).values()) == {1.0}
    reverse = ranking_metrics(relevance, -relevance, groups)
    assert reverse["mrr"] == 1 / 3 and reverse["ndcg_at_1"] == 0.0


def test_queries_without_a_relevant_row_are_left_out_not_scored_zero() -> None:
    relevance = np.array([1.0, 0.0, 0.0, 0.0])
    groups = np.array([0.0, 0.0, 1.0, 1.0])
    scores = np.array([0.9, 0.1, 0.5, 0.4])
    assert {k: len(v) for k, v in per_group(relevance, scores, groups).items()} == dict.fromkeys(
        ranking_metrics(relevance, scores, groups), 1
    )
    assert ranking_metrics(relevance, scores, groups)["ndcg_at_10"] == 1.0
    assert np.isnan(ranking_metrics(np.zeros(3), scores[:3], groups[:3])["mrr"])


def test_tied_scores_keep_the_holdout_order() -> None:
    # Both rows score alike; the relevant one comes second in the holdout, so it ranks second.
    metrics = ranking_metrics(np.array([0.0, 1.0]), np.array([0.5, 0.5]), np.zeros(2))
    assert metrics["mrr"] == 0.5
