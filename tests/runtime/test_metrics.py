"""Holdout metrics on small inputs whose values are worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from airflow_trainpipe.config.catalog import METRICS
from airflow_trainpipe.runtime.metrics import compute_metrics

BINARY = "binary_classification"


def test_binary_metrics_match_their_hand_computed_values() -> None:
    # Ranked by score: 0.8 (pos), 0.6 (neg), 0.4 (pos), 0.1 (neg); threshold 0.5 predicts [0, 1, 0, 1].
    metrics = compute_metrics(BINARY, np.array([0, 0, 1, 1]), np.array([0.1, 0.6, 0.4, 0.8]))
    assert metrics == pytest.approx(
        {
            "roc_auc": 3 / 4,  # 3 of the 4 (positive, negative) pairs are ordered correctly
            "pr_auc": 0.5 * 1 + 0.5 * 2 / 3,  # precision 1 at recall 1/2, 2/3 at recall 1
            "log_loss": -(math.log(0.9) + math.log(0.4) + math.log(0.4) + math.log(0.8)) / 4,
            "brier": (0.1**2 + 0.6**2 + 0.6**2 + 0.2**2) / 4,
            "accuracy": 0.5,
            "precision": 0.5,
            "recall": 0.5,
            "f1": 0.5,
        },
        rel=1e-12,
    )


def test_regression_metrics_match_their_hand_computed_values() -> None:
    y_true, prediction = np.array([1.0, 2.0, 0.0, 4.0]), np.array([2.0, 2.0, 1.0, 2.0])
    # errors 1, 0, 1, -2; mean of y 1.75, total sum of squares 8.75
    assert compute_metrics("regression", y_true, prediction) == pytest.approx(
        {
            "rmse": math.sqrt(6 / 4),
            "mae": 1.0,
            "mape": (1 / 1 + 0 / 2 + 2 / 4) / 3,  # the row whose truth is 0 is left out
            "r2": 1 - 6 / 8.75,
        },
        rel=1e-12,
    )


@pytest.mark.parametrize(
    ("task", "y_true", "prediction"),
    [(BINARY, [0, 1, 1], [0.2, 0.7, 0.4]), ("regression", [1.0, 3.0], [2.0, 2.5])],
)
def test_every_metric_the_catalog_names_is_computed_and_nothing_else(
    task: str, y_true: list[float], prediction: list[float]
) -> None:
    assert set(compute_metrics(task, np.array(y_true), np.array(prediction))) == set(METRICS[task])


def test_a_probability_of_exactly_one_half_predicts_the_positive_class() -> None:
    metrics = compute_metrics(BINARY, np.array([1, 0]), np.array([0.5, 0.49]))
    assert (metrics["accuracy"], metrics["precision"], metrics["recall"]) == (1.0, 1.0, 1.0)


def test_certain_wrong_predictions_cost_the_clipped_log_loss_not_infinity() -> None:
    metrics = compute_metrics(BINARY, np.array([1, 0]), np.array([0.0, 1.0]))
    assert metrics["log_loss"] == pytest.approx(-math.log(1e-7), rel=1e-6)
    assert metrics["brier"] == 1.0 and metrics["accuracy"] == 0.0


def test_a_holdout_with_one_class_has_no_ranking_metrics_but_keeps_the_others() -> None:
    metrics = compute_metrics(BINARY, np.array([1, 1]), np.array([0.9, 0.2]))
    assert math.isnan(metrics["roc_auc"]) and math.isnan(metrics["pr_auc"])
    assert metrics["log_loss"] == pytest.approx(-(math.log(0.9) + math.log(0.2)) / 2, rel=1e-12)
    assert (metrics["accuracy"], metrics["recall"]) == (0.5, 0.5)


def test_no_predicted_positives_score_zero_precision_and_f1() -> None:
    metrics = compute_metrics(BINARY, np.array([0, 1, 1]), np.array([0.1, 0.2, 0.3]))
    assert (metrics["precision"], metrics["recall"], metrics["f1"]) == (0.0, 0.0, 0.0)
    assert metrics["accuracy"] == pytest.approx(1 / 3)


def test_mape_is_undefined_when_every_true_value_is_zero() -> None:
    metrics = compute_metrics("regression", np.zeros(3), np.array([1.0, -1.0, 2.0]))
    assert math.isnan(metrics["mape"])
    assert metrics["mae"] == pytest.approx(4 / 3) and metrics["rmse"] == pytest.approx(math.sqrt(2))


def test_integer_labels_and_lists_are_accepted_as_numbers() -> None:
    assert compute_metrics("regression", [1, 2, 3], [1, 2, 5])["mae"] == pytest.approx(2 / 3)  # type: ignore[arg-type]
