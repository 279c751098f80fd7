"""Holdout metrics on small inputs whose values are worked out by hand."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from airflow_trainpipe.config.catalog import METRICS
from airflow_trainpipe.config.evaluation import PrecisionAt
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics

BINARY = "binary_classification"
MULTICLASS = "multiclass_classification"


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
            "predicted_positive_rate": 0.5,  # 0.6 and 0.8 of the four flagged
            "threshold": 0.5,
        },
        rel=1e-12,
    )


def test_a_threshold_rule_picks_its_threshold_and_every_class_metric_follows() -> None:
    labels, scores = np.array([0, 0, 1, 1]), np.array([0.1, 0.6, 0.4, 0.8])
    # At 0.8: 1 true, 0 false positives (f1 2/3); at 0.4: 2 true, 1 false (f1 0.8).
    best_f1 = compute_metrics(BINARY, labels, scores, threshold="max_f1")
    assert (best_f1["threshold"], best_f1["recall"], best_f1["precision"]) == (0.4, 1.0, pytest.approx(2 / 3))
    assert (best_f1["f1"], best_f1["predicted_positive_rate"]) == (pytest.approx(0.8), 0.75)
    precise = compute_metrics(BINARY, labels, scores, threshold=PrecisionAt(precision_at=0.9))
    assert (precise["threshold"], precise["precision"], precise["recall"]) == (0.8, 1.0, 0.5)
    fixed = compute_metrics(BINARY, labels, scores, threshold=0.05)
    assert (fixed["threshold"], fixed["recall"], fixed["precision"]) == (0.05, 1.0, 0.5)
    # The rankings do not depend on the threshold.
    assert {k: best_f1[k] for k in ("roc_auc", "pr_auc", "log_loss")} == {
        k: fixed[k] for k in ("roc_auc", "pr_auc", "log_loss")
    }


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
    ("task", "y_true", "prediction", "extra"),
    [
        # and the threshold the class metrics used, with the share of rows it flags (binary):
        # recorded, never gated on
        (BINARY, [0, 1, 1], [0.2, 0.7, 0.4], {"threshold", "predicted_positive_rate"}),
        ("regression", [1.0, 3.0], [2.0, 2.5], set()),
        # and the recall of each class, by its name (two classes here: 0 and 1)
        (MULTICLASS, [0, 1], [[0.7, 0.3], [0.4, 0.6]], {"recall_0", "recall_1"}),
        ("ranking", [0, 2, 1], [0.1, 0.3, 0.2], set()),
    ],
)
def test_every_metric_the_catalog_names_is_computed_and_nothing_else(
    task: str, y_true: list[float], prediction: list[float], extra: set[str]
) -> None:
    groups = np.zeros(len(y_true)) if task == "ranking" else None
    computed = compute_metrics(task, np.array(y_true), np.array(prediction), groups=groups)
    assert set(computed) == set(METRICS[task]) | extra


@pytest.mark.parametrize("seed", range(4))
def test_multiclass_metrics_equal_sklearn_s(seed: int) -> None:
    from sklearn import metrics as sk

    rng = np.random.default_rng(seed)
    n, k = 400, 3 + seed
    labels = rng.integers(0, k, n)
    probabilities = rng.dirichlet(np.ones(k), n)
    probabilities[np.arange(n), labels] += rng.random(n)  # better than chance, not perfect
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    classes = [f"class {c}" for c in range(k)]
    metrics = compute_metrics(MULTICLASS, labels, probabilities, classes=classes)
    predicted = probabilities.argmax(axis=1)
    assert metrics == pytest.approx(
        {
            "accuracy": sk.accuracy_score(labels, predicted),
            "balanced_accuracy": sk.balanced_accuracy_score(labels, predicted),
            "macro_f1": sk.f1_score(labels, predicted, average="macro"),
            "log_loss": sk.log_loss(labels, probabilities),
            **{
                f"recall_class {c}": r for c, r in enumerate(sk.recall_score(labels, predicted, average=None))
            },
        },
        rel=1e-12,
    )


def test_a_class_the_model_never_saw_is_always_wrong_and_costs_the_floor_probability() -> None:
    # Row 3's class (-1) is not among the model's two: wrong, with probability 1e-7 for its class.
    metrics = compute_metrics(
        MULTICLASS, np.array([0, 1, -1]), np.array([[0.9, 0.1], [0.2, 0.8], [0.5, 0.5]])
    )
    assert metrics["accuracy"] == pytest.approx(2 / 3)
    assert metrics["log_loss"] == pytest.approx(-(math.log(0.9) + math.log(0.8) + math.log(1e-7)) / 3)
    assert (metrics["recall_0"], metrics["recall_1"]) == (1.0, 1.0)


def test_class_names_become_valid_mlflow_metric_names() -> None:
    metrics = compute_metrics(MULTICLASS, np.array([0, 1]), np.eye(2), classes=["home & garden", "a/b"])
    assert {"recall_home _ garden", "recall_a/b"} <= set(metrics)


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


@pytest.mark.parametrize("seed", range(12))
def test_every_metric_equals_sklearn_s_with_ties_imbalance_and_constant_labels(seed: int) -> None:
    # The metrics are computed without sklearn (its scorers copy the holdout many times over);
    # sklearn stays the reference they are held to.
    from sklearn import metrics as skm

    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 3000))
    labels = (rng.random(n) < rng.uniform(0.005, 0.95)).astype(int)
    scores = np.round(rng.random(n), int(rng.integers(1, 4)))  # coarse scores: many ties
    if seed % 4 == 0:
        scores[:] = 0.5
    expected = {
        "roc_auc": skm.roc_auc_score(labels, scores),
        "pr_auc": skm.average_precision_score(labels, scores),
        "log_loss": skm.log_loss(labels, np.clip(scores, 1e-7, 1 - 1e-7), labels=[0, 1]),
        "brier": skm.brier_score_loss(labels, scores),
        "accuracy": skm.accuracy_score(labels, scores >= 0.5),
        "precision": skm.precision_score(labels, scores >= 0.5, zero_division=0),
        "recall": skm.recall_score(labels, scores >= 0.5, zero_division=0),
        "f1": skm.f1_score(labels, scores >= 0.5, zero_division=0),
        "predicted_positive_rate": float(np.mean(scores >= 0.5)),
        "threshold": 0.5,
    }
    assert compute_metrics(BINARY, labels, scores) == pytest.approx(expected, rel=1e-12, abs=1e-12)
    if 0 < labels.sum() < n:
        _rules_match_a_search_over_every_threshold(labels, scores, skm, float(rng.uniform(0.05, 1.0)))

    values = rng.normal(size=n) * 5 + (0 if seed % 3 else 1e6)  # a large mean: no cancellation
    if seed % 5 == 0:
        values[:] = 3.0
    predicted = values + rng.normal(size=n)
    nonzero = np.abs(values) > 1e-12
    assert compute_metrics("regression", values, predicted) == pytest.approx(
        {
            "rmse": np.sqrt(skm.mean_squared_error(values, predicted)),
            "mae": skm.mean_absolute_error(values, predicted),
            "mape": skm.mean_absolute_percentage_error(values[nonzero], predicted[nonzero]),
            "r2": skm.r2_score(values, predicted),
        },
        rel=1e-9,
    )


def _rules_match_a_search_over_every_threshold(labels: np.ndarray, scores: np.ndarray, skm, p: float) -> None:
    """max_f1 and precision_at against sklearn's precision and recall at every distinct score (its
    curve stops where recall first reaches 1: lower thresholds only add false positives)."""
    precision, recall, thresholds = skm.precision_recall_curve(labels, scores)
    precision, recall = precision[:-1], recall[:-1]  # the curve's (1, 0) end point has no threshold
    f1 = np.where(
        precision + recall > 0, 2 * precision * recall / np.maximum(precision + recall, 1e-300), 0.0
    )
    chosen = compute_metrics(BINARY, labels, scores, threshold="max_f1")
    assert chosen["f1"] == pytest.approx(f1.max(), rel=1e-12)
    assert thresholds[np.isclose(f1, f1.max(), rtol=1e-12, atol=0)].max() == chosen["threshold"]
    precise = compute_metrics(BINARY, labels, scores, threshold=PrecisionAt(precision_at=p))
    reaching = precision >= p
    if reaching.any():
        assert precise["precision"] >= p and precise["recall"] == pytest.approx(
            recall[reaching].max(), rel=1e-12
        )
    else:  # none reaches p: the most precise threshold
        assert precise["precision"] == pytest.approx(precision.max())


def _metrics_rank(store: str, rank: int, world_size: int, shards: str, out: str) -> None:
    import json

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    data = np.load(shards)
    share = {key: data[key][data["owner"] == rank] for key in data.files}
    result = {
        "binary": compute_metrics(BINARY, share["labels"], share["scores"], world_size=world_size),
        "max_f1": compute_metrics(
            BINARY, share["labels"], share["scores"], world_size=world_size, threshold="max_f1"
        ),
        "precision_at": compute_metrics(
            BINARY,
            share["labels"],
            share["scores"],
            world_size=world_size,
            threshold=PrecisionAt(precision_at=0.2),
        ),
        "regression": compute_metrics(
            "regression", share["values"], share["predicted"], world_size=world_size
        ),
        "multiclass": compute_metrics(
            MULTICLASS,
            share["classes"],
            share["probabilities"],
            world_size=world_size,
            classes=["a", "b", "c"],
        ),
        # Each rank holds parts of queries whose other rows another rank holds.
        "ranking": compute_metrics(
            "ranking", share["relevance"], share["values"], world_size=world_size, groups=share["queries"]
        ),
    }
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


def test_ranks_holding_shares_get_the_metrics_of_all_rows(tmp_path: Path) -> None:
    import json
    import multiprocessing

    rng = np.random.default_rng(5)
    n = 5000
    labels = (rng.random(n) < 0.1).astype(int)
    scores = np.round(rng.random(n), 2)  # ties within and across ranks
    values = rng.normal(size=n) * 4 + 1e5
    predicted = values + rng.normal(size=n)
    owner = rng.choice([0, 2], size=n)  # rank 1 holds no rows at all
    classes = rng.integers(0, 3, n)
    probabilities = rng.dirichlet(np.ones(3), n)
    queries, relevance = rng.integers(0, 300, n).astype(float), rng.integers(0, 3, n)
    np.savez(
        tmp_path / "shards.npz",
        labels=labels,
        scores=scores,
        values=values,
        predicted=predicted,
        owner=owner,
        classes=classes,
        probabilities=probabilities,
        queries=queries,
        relevance=relevance,
    )
    context = multiprocessing.get_context("spawn")
    outs = [tmp_path / f"rank{r}.json" for r in range(3)]
    ranks = [
        context.Process(
            target=_metrics_rank,
            args=(str(tmp_path / "store"), r, 3, str(tmp_path / "shards.npz"), str(outs[r])),
        )
        for r in range(3)
    ]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(120)
        assert process.exitcode == 0
    results = [json.loads(out.read_text()) for out in outs]
    assert results[1] == results[0] == results[2]
    assert results[0]["binary"] == pytest.approx(compute_metrics(BINARY, labels, scores), rel=1e-12)
    assert results[0]["max_f1"] == pytest.approx(
        compute_metrics(BINARY, labels, scores, threshold="max_f1"), rel=1e-12
    )
    assert results[0]["precision_at"] == pytest.approx(
        compute_metrics(BINARY, labels, scores, threshold=PrecisionAt(precision_at=0.2)), rel=1e-12
    )
    assert results[0]["max_f1"]["threshold"] != 0.5  # the rule chose, on every rank alike
    assert results[0]["regression"] == pytest.approx(
        compute_metrics("regression", values, predicted), rel=1e-9
    )
    assert results[0]["multiclass"] == pytest.approx(
        compute_metrics(MULTICLASS, classes, probabilities, classes=["a", "b", "c"]), rel=1e-12
    )
    # The ranks gather in rank order, so a query's rows keep their holdout order only within a
    # rank: compared on scores that do not tie, where that order does not matter.
    assert results[0]["ranking"] == pytest.approx(
        compute_metrics("ranking", relevance, values, groups=queries), rel=1e-12
    )
