"""Holdout metrics, named as in config.catalog.METRICS: one function for the candidate and the
champion on one process, and for the training ranks' shares of the holdout together.

Exact, and lean. Every metric is a sum except the two rankings, and those are counts: ROC AUC
and average precision need, for each distinct score of a positive row, how many negatives score
below it and how many tie with it. So each rank sorts its own negatives, every rank gets all the
positives' scores (one all-gather, 8 bytes a positive), and the counts each rank finds by
binary search are summed across ranks: the same values as over the gathered holdout (ties
scored as sklearn scores them; the tests hold every metric to sklearn's), while no process holds
more than its share of the negatives. sklearn's own scorers copied the holdout several times over
(about 160 MiB on 3.2M rows) and gathering the predictions to one rank grew with the holdout.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from airflow_trainpipe.runtime.evaluation.ranking import ranking_metrics

_CHUNK = 1 << 20  # rows per pass of the element-wise sums: bounds their temporaries


class _World:
    """Sums and concatenations over the ranks of `group`; the identity on one process."""

    def __init__(self, group: Any = None, world_size: int = 1):
        self.group, self.world_size = group, world_size

    def total(self, values: np.ndarray) -> np.ndarray:
        if self.world_size == 1:
            return values
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
        dist.all_reduce(tensor, group=self.group)
        return tensor.numpy().astype(values.dtype)

    def concat(self, values: np.ndarray) -> np.ndarray:
        """Every rank's `values`, in rank order."""
        if self.world_size == 1:
            return values
        import torch
        import torch.distributed as dist

        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        dist.all_gather(sizes, torch.tensor([len(values)], dtype=torch.int64), group=self.group)
        longest = max(int(s) for s in sizes)
        padded = torch.zeros(longest, dtype=torch.float64)
        padded[: len(values)] = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64))
        parts = [torch.empty(longest, dtype=torch.float64) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        return np.concatenate([p[: int(s)].numpy() for p, s in zip(parts, sizes, strict=True)])


def compute_metrics(
    task: str,
    y_true: np.ndarray,
    prediction: np.ndarray,
    group: Any = None,
    world_size: int = 1,
    threshold: Any = 0.5,
    *,
    groups: np.ndarray | None = None,
    classes: list[str] | None = None,
) -> dict[str, float]:
    """`prediction`: probabilities of class 1 (binary), (rows, classes) probabilities with
    `y_true` the class index (multiclass, -1: a class the model does not know, always wrong),
    scores with `groups` each row's query code (ranking), or values in label units (regression).

    `threshold` (binary): config.evaluation's rule, a number, `"max_f1"` or an object with a
    `precision_at`; the threshold it chose is returned as the metric `threshold`, and the share of
    rows at or above it as `predicted_positive_rate`. `classes`
    (multiclass): the names of the `recall_<class>` metrics.

    With `world_size` > 1, a collective over `group`: each rank passes its share of the rows and
    every rank gets the metrics of all of them.
    """
    world = _World(group, world_size)
    y_true = np.asarray(y_true, dtype=np.float64)
    prediction = np.asarray(prediction, dtype=np.float64)
    if task == "binary_classification":
        return _binary(world, y_true == 1, prediction, threshold)
    if task == "multiclass_classification":
        return _multiclass(world, y_true.astype(np.int64), prediction, classes)
    if task == "ranking":
        if groups is None:
            raise ValueError("ranking metrics need each row's group")
        # Per-query metrics need a query's rows together: the ranks' shares are gathered (three
        # float64 per holdout row), and every rank scores all of them.
        labels, scores, codes = (
            world.concat(np.asarray(v, np.float64)) for v in (y_true, prediction, groups)
        )
        return ranking_metrics(labels, scores, codes)
    return _regression(world, y_true, prediction)


def _multiclass(
    world: _World, y_true: np.ndarray, probabilities: np.ndarray, classes: list[str] | None
) -> dict[str, float]:
    count = probabilities.shape[1] if probabilities.ndim == 2 else len(classes or [])
    names = classes or [str(c) for c in range(count)]
    known = y_true >= 0
    predicted = probabilities.argmax(axis=1) if len(y_true) else np.zeros(0, np.int64)
    correct = known & (predicted == y_true)
    chosen = probabilities[np.flatnonzero(known), y_true[known]] if len(y_true) else np.zeros(0)
    # A class the model does not know gets the floor probability, as any unpredicted class would.
    log_likelihood = float(np.log(np.clip(chosen, 1e-7, 1.0)).sum()) + np.log(1e-7) * int((~known).sum())
    sums = world.total(
        np.concatenate(
            [
                [len(y_true), int(correct.sum()), log_likelihood],
                np.bincount(y_true[correct], minlength=count),  # true positives per class
                np.bincount(y_true[known], minlength=count),  # rows per true class
                np.bincount(predicted, minlength=count),  # rows per predicted class
            ]
        ).astype(np.float64)
    )
    n, hits, log_likelihood = sums[:3]
    tp, support, chosen_count = sums[3 : 3 + count], sums[3 + count : 3 + 2 * count], sums[3 + 2 * count :]
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = tp / support
        f1 = 2 * tp / (support + chosen_count)
    present = (support + chosen_count) > 0  # sklearn's macro average: classes seen or predicted
    in_data = support > 0
    metrics = {
        "accuracy": float(hits / n) if n else float("nan"),
        "balanced_accuracy": float(recall[in_data].mean()) if in_data.any() else float("nan"),
        "macro_f1": float(f1[present].mean()) if present.any() else float("nan"),
        "log_loss": float(-log_likelihood / n) if n else float("nan"),
    }
    metrics.update({f"recall_{metric_safe(name)}": float(r) for name, r in zip(names, recall, strict=True)})
    return metrics


def metric_safe(name: str) -> str:
    """A class value as part of an MLflow metric name (letters, digits, `_-./ `; others become `_`)."""
    return re.sub(r"[^\w\-./ ]", "_", name)[:200]


def _binary(world: _World, positive: np.ndarray, score: np.ndarray, rule: Any) -> dict[str, float]:
    local = np.array([len(score), np.count_nonzero(positive)], dtype=np.int64)
    n, positives = (int(v) for v in world.total(local))
    auc = ap = float("nan")
    threshold = rule if isinstance(rule, float | int) else 0.5  # a rule with one class present: the default
    if 0 < positives < n:  # both classes present somewhere: the rankings are defined
        negatives = score[~positive]
        negatives.sort()  # in place: the copy the mask made is the only one
        auc, ap, curve = _rankings(world, score[positive], negatives, positives, n - positives)
        if not isinstance(rule, float | int):
            threshold = _chosen(rule, *curve)
    predicted = score >= threshold
    log_likelihood = brier = 0.0
    for start in range(0, len(score), _CHUNK):
        part, hit = score[start : start + _CHUNK], positive[start : start + _CHUNK]
        clipped = np.clip(part, 1e-7, 1 - 1e-7)
        log_likelihood += float(np.log(clipped[hit]).sum() + np.log1p(-clipped[~hit]).sum())
        brier += float(np.square(part - hit).sum())
    counts = world.total(np.array([np.count_nonzero(predicted & positive), np.count_nonzero(predicted)]))
    tp, predicted_positive = (int(v) for v in counts)
    log_likelihood, brier = (float(v) for v in world.total(np.array([log_likelihood, brier])))
    fp, fn = predicted_positive - tp, positives - tp
    metrics = {
        "log_loss": -log_likelihood / n,
        "brier": brier / n,
        "accuracy": (n - fp - fn) / n,
        "precision": tp / (tp + fp) if tp + fp else 0.0,
        "recall": tp / positives if positives else 0.0,
        "f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 0.0,
        # 0 or 1: the class metrics are a constant predictor's (the gate refuses to promote on them).
        "predicted_positive_rate": predicted_positive / n,
    }
    return {"roc_auc": auc, "pr_auc": ap, **metrics, "threshold": float(threshold)}


def _chosen(
    rule: Any, scores: np.ndarray, true_at_or_above: np.ndarray, false_at_or_above: np.ndarray
) -> float:
    """The threshold a rule picks among the positives' distinct scores, lowest last.

    Those are the only candidates either rule needs: between two of them only negatives change
    side, so moving down to the next negative adds false positives and no true one. Ties go to
    the higher threshold (fewer rows flagged for the same f1 or recall)."""
    positives = int(true_at_or_above[0])
    precision = true_at_or_above / (true_at_or_above + false_at_or_above)
    if rule == "max_f1":
        # f1 = 2tp / (2tp + fp + fn) = 2tp / (tp + fp + P); scanned from the highest threshold.
        f1 = 2 * true_at_or_above / (true_at_or_above + false_at_or_above + positives)
        return float(scores[::-1][int(np.argmax(f1[::-1]))])
    reached = np.nonzero(precision >= rule.precision_at)[0]
    if len(reached) == 0:  # no threshold reaches it: the most precise one (recorded by its value)
        return float(scores[::-1][int(np.argmax(precision[::-1]))])
    return float(scores[reached[0]])  # the lowest such threshold: the most recall


def _rankings(
    world: _World, positive_scores: np.ndarray, my_negatives: np.ndarray, positives: int, negatives: int
) -> tuple[float, float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """ROC AUC and average precision, over each distinct score `u` of a positive row; and, per
    such `u` (ascending), the positives and negatives scoring at least `u` (the threshold curve)."""
    scores, count = np.unique(world.concat(positive_scores), return_counts=True)
    below = world.total(np.searchsorted(my_negatives, scores, "left").astype(np.int64))
    tied = world.total(np.searchsorted(my_negatives, scores, "right").astype(np.int64)) - below
    # AUC: a positive beats the negatives below it and ties half of those level with it.
    auc = float(np.dot(count, below + 0.5 * tied)) / (positives * negatives)
    # Average precision: recall gained at threshold u times the precision at u, summed (sklearn's).
    true_at_or_above = np.cumsum(count[::-1])[::-1]
    false_at_or_above = negatives - below
    precision = true_at_or_above / (true_at_or_above + false_at_or_above)
    return auc, float(np.dot(count, precision)) / positives, (scores, true_at_or_above, false_at_or_above)


def _regression(world: _World, y_true: np.ndarray, prediction: np.ndarray) -> dict[str, float]:
    error = prediction - y_true
    nonzero = np.abs(y_true) > 1e-12
    mean = float(y_true.mean()) if len(y_true) else 0.0
    spread = y_true - mean
    sums = world.total(
        np.array(
            [
                len(error),
                float(np.dot(error, error)),
                float(np.abs(error).sum()),
                float(np.abs(error[nonzero] / y_true[nonzero]).sum()),
                np.count_nonzero(nonzero),
            ]
        )
    )
    n, squares, absolute, relative, nonzeros = (float(v) for v in sums)
    total = _merged_sum_of_squares(world.concat(np.array([len(y_true), mean, float(np.dot(spread, spread))])))
    # sklearn's r2_score with force_finite: a constant label scores 1.0 when predicted exactly, else 0.0.
    r2 = 1.0 - squares / total if total else (1.0 if squares == 0 else 0.0)
    return {
        "rmse": float(np.sqrt(squares / n)),
        "mae": absolute / n,
        "mape": relative / nonzeros if nonzeros else float("nan"),
        "r2": float(r2),
    }


def _merged_sum_of_squares(parts: np.ndarray) -> float:
    """The labels' sum of squared deviations from the mean of all ranks, from each rank's
    (rows, mean, sum of squares) in rank order (Chan et al.'s pairwise update: no cancellation
    from a large mean)."""
    count, mean, total = 0.0, 0.0, 0.0
    for rows, part_mean, part_total in parts.reshape(-1, 3):
        if rows:
            delta = part_mean - mean
            merged = count + rows
            total += part_total + delta * delta * count * rows / merged
            mean += delta * rows / merged
            count = merged
    return total
