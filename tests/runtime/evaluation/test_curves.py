"""The ROC and precision-recall points the gate's report draws, held to sklearn's curves."""

from __future__ import annotations

import numpy as np
import pytest

from airflow_trainpipe.runtime.evaluation.curves import binary_curves


@pytest.mark.parametrize("seed", range(3))
def test_unthinned_curves_are_sklearn_s(seed: int) -> None:
    from sklearn.metrics import precision_recall_curve, roc_curve

    rng = np.random.default_rng(seed)
    labels = (rng.random(2000) < 0.15).astype(int)
    scores = np.round(rng.random(2000) + 0.4 * labels, 2)  # ties
    curves = binary_curves(labels, scores, points=10**6)
    assert curves is not None
    fpr, tpr, _ = roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(curves["roc"], np.column_stack([fpr, tpr]), atol=1e-5)
    precision, recall, _ = precision_recall_curve(labels, scores, drop_intermediate=False)
    # sklearn lists them by ascending threshold and ends with (recall 0, precision 1)
    np.testing.assert_allclose(curves["pr"], np.column_stack([recall, precision])[-2::-1], atol=1e-5)


def test_a_large_holdout_is_thinned_to_the_points_asked_for_ending_at_the_corner() -> None:
    rng = np.random.default_rng(0)
    labels = (rng.random(100_000) < 0.1).astype(int)
    curves = binary_curves(labels, rng.random(100_000), points=200)
    assert curves is not None
    assert len(curves["roc"]) == 201 and curves["roc"][-1] == [1.0, 1.0]
    assert len(curves["pr"]) == 200 and curves["pr"][-1][0] == 1.0


def test_one_class_has_no_curves() -> None:
    assert binary_curves(np.zeros(5), np.arange(5.0)) is None
