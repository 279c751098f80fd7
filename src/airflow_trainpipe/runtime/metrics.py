"""Holdout metrics, named as in config.catalog.METRICS; one function for candidate and champion."""

from __future__ import annotations

import numpy as np
from sklearn import metrics as skm


def compute_metrics(task: str, y_true: np.ndarray, prediction: np.ndarray) -> dict[str, float]:
    """`prediction`: probabilities of class 1 (binary) or values in label units (regression)."""
    y_true = np.asarray(y_true, dtype=np.float64)
    prediction = np.asarray(prediction, dtype=np.float64)
    if task == "binary_classification":
        labels = y_true.astype(int)
        clipped = np.clip(prediction, 1e-7, 1 - 1e-7)
        predicted = (prediction >= 0.5).astype(int)
        both = len(np.unique(labels)) == 2
        return {
            "roc_auc": float(skm.roc_auc_score(labels, prediction)) if both else float("nan"),
            "pr_auc": float(skm.average_precision_score(labels, prediction)) if both else float("nan"),
            "log_loss": float(skm.log_loss(labels, clipped, labels=[0, 1])),
            "brier": float(skm.brier_score_loss(labels, prediction)),
            "accuracy": float(skm.accuracy_score(labels, predicted)),
            "precision": float(skm.precision_score(labels, predicted, zero_division=0)),
            "recall": float(skm.recall_score(labels, predicted, zero_division=0)),
            "f1": float(skm.f1_score(labels, predicted, zero_division=0)),
        }
    error = prediction - y_true
    nonzero = np.abs(y_true) > 1e-12
    return {
        "rmse": float(np.sqrt(np.mean(error**2))),
        "mae": float(np.mean(np.abs(error))),
        "mape": float(np.mean(np.abs(error[nonzero] / y_true[nonzero]))) if nonzero.any() else float("nan"),
        "r2": float(skm.r2_score(y_true, prediction)),
    }
