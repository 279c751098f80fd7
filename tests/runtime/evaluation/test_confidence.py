"""The paired bootstrap behind gate.confidence: noise is not significant, a real improvement is."""

from __future__ import annotations

import math

import numpy as np
import pytest

from airflow_trainpipe.runtime.evaluation.confidence import improvement_interval

BINARY = "binary_classification"


def _scores(rng: np.random.Generator, labels: np.ndarray, signal: float) -> np.ndarray:
    """Probabilities whose ROC AUC grows with `signal` (0: chance)."""
    logits = signal * (2 * labels - 1) + rng.normal(size=len(labels))
    return 1 / (1 + np.exp(-logits))


def _interval(labels, candidate, champion, *, task=BINARY, metric="roc_auc", direction="maximize", **kw):
    options = {"confidence": 0.95, "samples": 400, "seed": 0} | kw
    return improvement_interval(task, metric, direction, labels, (candidate, 0.5), (champion, 0.5), **options)


def test_two_equally_good_models_are_not_significantly_different() -> None:
    rng = np.random.default_rng(1)
    labels = (rng.random(3000) < 0.2).astype(float)
    low, high = _interval(labels, _scores(rng, labels, 1.0), _scores(rng, labels, 1.0))
    assert low < 0 < high


def test_a_real_improvement_is_significant_on_the_same_rows() -> None:
    rng = np.random.default_rng(2)
    labels = (rng.random(3000) < 0.2).astype(float)
    low, high = _interval(labels, _scores(rng, labels, 1.5), _scores(rng, labels, 1.0))
    assert 0 < low < high


def test_pairing_narrows_the_interval_of_two_models_that_share_their_errors() -> None:
    # The champion is the candidate plus a small, uninformative perturbation: the same rows are
    # hard for both, and the paired interval of their difference is tight around it.
    rng = np.random.default_rng(3)
    labels = (rng.random(3000) < 0.2).astype(float)
    candidate = _scores(rng, labels, 1.0)
    champion = np.clip(candidate + rng.normal(scale=0.02, size=3000), 0, 1)
    low, high = _interval(labels, candidate, champion)
    assert high - low < 0.02


def test_a_tiny_holdout_is_not_significant_even_for_a_large_point_improvement() -> None:
    rng = np.random.default_rng(4)
    labels = np.array([0, 1, 0, 0, 1, 0, 1, 0, 0, 1], dtype=float)
    better = labels * 0.6 + rng.random(10) * 0.4  # perfectly ranked
    worse = rng.random(10)
    low, _ = _interval(labels, better, worse)
    assert low <= 0


def test_a_holdout_with_one_class_has_no_interval() -> None:
    labels = np.zeros(50)
    assert _interval(labels, np.full(50, 0.1), np.full(50, 0.2)) == (-math.inf, math.inf)


def test_the_interval_is_seeded() -> None:
    rng = np.random.default_rng(5)
    labels = (rng.random(500) < 0.3).astype(float)
    a, b = _scores(rng, labels, 1.2), _scores(rng, labels, 1.0)
    assert _interval(labels, a, b) == _interval(labels, a, b)
    assert _interval(labels, a, b) != _interval(labels, a, b, seed=1)


def test_for_a_metric_to_minimise_better_is_positive() -> None:
    rng = np.random.default_rng(6)
    truth = rng.normal(size=2000)
    close, far = truth + rng.normal(scale=0.5, size=2000), truth + rng.normal(scale=1.0, size=2000)
    low, high = _interval(truth, close, far, task="regression", metric="rmse", direction="minimize")
    assert 0 < low < high
    assert _interval(truth, far, close, task="regression", metric="rmse", direction="minimize")[1] < 0


@pytest.mark.parametrize("confidence", [0.8, 0.99])
def test_a_higher_confidence_widens_the_interval(confidence: float) -> None:
    rng = np.random.default_rng(7)
    labels = (rng.random(1000) < 0.3).astype(float)
    a, b = _scores(rng, labels, 1.2), _scores(rng, labels, 1.0)
    low, high = _interval(labels, a, b, confidence=confidence)
    mid_low, mid_high = _interval(labels, a, b, confidence=0.95)
    assert (high - low > mid_high - mid_low) == (confidence > 0.95)


def test_a_ranking_holdout_is_resampled_by_query() -> None:
    rng = np.random.default_rng(3)
    groups = np.repeat(np.arange(400), rng.integers(5, 20, 400)).astype(float)
    relevance = ((rng.random(len(groups)) < 0.3) * rng.integers(1, 4, len(groups))).astype(float)

    def ranker(signal: float) -> np.ndarray:
        return signal * relevance + rng.normal(size=len(relevance))

    def interval(candidate: np.ndarray, champion: np.ndarray) -> tuple[float, float]:
        return _interval(relevance, candidate, champion, task="ranking", metric="ndcg_at_10", groups=groups)

    low, high = interval(ranker(0.8), ranker(0.8))
    assert low < 0 < high  # equally good: noise
    low, high = interval(ranker(1.5), ranker(0.5))
    assert 0 < low < high  # a better ranker on the same queries
    same = ranker(1.0)
    assert interval(same, same) == (0.0, 0.0)
    # One query is not enough to tell anything.
    one = groups == 0
    assert improvement_interval(
        "ranking", "mrr", "maximize", relevance[one], (same[one], 0.5), (same[one], 0.5),
        confidence=0.95, samples=100, seed=0, groups=groups[one],
    ) == (-math.inf, math.inf)  # fmt: skip
