"""The gate's HTML report: what each task type's page shows, read back from the page itself."""

from __future__ import annotations

import re

import numpy as np
import pytest

from airflow_trainpipe.contracts.payloads import (
    Evaluation,
    GateDecision,
    GuardrailCheck,
    SliceCheck,
    SliceScore,
)
from airflow_trainpipe.registry.gate_report import gate_report_html


def _decision(**changes) -> GateDecision:
    fields = {
        "promote": False,
        "reason": "not significant: the 95% interval of the metric improvement is [-0.01, 0.03] <script>",
        "metric": "roc_auc",
        "direction": "maximize",
        "candidate": 0.81,
        "champion": 0.8,
        "improvement": 0.01,
        "relative_improvement": 0.0125,
        "confidence": 0.95,
        "improvement_interval": (-0.01, 0.03),
        "mlflow_run_id": "abc123",
        "model_name": "fraud_detector",
        "champion_version": "3",
    }
    return GateDecision(**(fields | changes))


def _rows(page: str, table_heading: str) -> list[list[str]]:
    """The cells of the table after `table_heading`, tags stripped, header row first."""
    table = page.split(f"<h2>{table_heading}</h2>", 1)[1].split("</table>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<t[dh]>(.*?)</t[dh]>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", table)
    ]


def test_a_binary_report_draws_both_models_curves_the_interval_and_the_slices() -> None:
    from airflow_trainpipe.runtime.evaluation.curves import binary_curves

    rng = np.random.default_rng(0)
    labels = (rng.random(500) < 0.2).astype(int)
    curves = {
        "candidate": binary_curves(labels, labels * 0.5 + rng.random(500)),
        "champion": binary_curves(labels, labels * 0.3 + rng.random(500)),
    }
    evaluation = Evaluation(
        holdout_rows=500,
        candidate={"roc_auc": 0.81, "recall": 0.6},
        champion={"roc_auc": 0.8, "recall": 0.62},
        champion_version="3",
        improvement_interval=(-0.01, 0.03),
        slices=[
            SliceScore(slice="channel=pos", rows=300, candidate={"roc_auc": 0.85}, champion={"roc_auc": 0.8}),
            SliceScore(slice="channel=web", rows=150, candidate={"roc_auc": 0.7}, champion={"roc_auc": 0.78}),
            SliceScore(slice="channel=atm", rows=50, candidate={"roc_auc": 0.5}, champion={"roc_auc": 0.9}),
        ],
    )
    decision = _decision(
        guardrails=[
            GuardrailCheck(
                metric="recall", direction="maximize", candidate=0.6, champion=0.62, regression=0.02,
                relative_regression=0.032, max_regression=None, max_relative_regression=0.05, passed=True,
            )
        ],
        slice_checks=[
            SliceCheck(slice=s, rows=r, metric="roc_auc", candidate=c, champion=0.8, regression=0.8 - c,
                       max_regression=0.05, passed=0.8 - c <= 0.05)
            for s, r, c in (("channel=pos", 300, 0.85), ("channel=web", 150, 0.7))
        ],
    )  # fmt: skip
    page = gate_report_html(decision, evaluation, "binary_classification", curves)
    assert "<b>KEEP THE CHAMPION</b>" in page
    assert "&lt;script&gt;" in page and "<script>" not in page  # the reason is text, never markup
    assert page.count("<svg") == 3  # interval, ROC, precision-recall
    assert ">ROC<" in page and ">Precision-recall<" in page
    assert ["interval", "[-0.01, 0.03]"] in _rows(page, "Primary metric")
    assert _rows(page, "Every metric")[1:] == [
        ["roc_auc", "0.81", "0.8", "0.01"],
        ["recall", "0.6", "0.62", "-0.02"],
    ]
    assert _rows(page, "Guardrails")[1][-1] == "pass"
    assert _rows(page, "Slices")[1:] == [
        ["channel=pos", "300", "0.85", "0.8", "pass"],
        ["channel=web", "150", "0.7", "0.78", "REGRESSED"],
        ["channel=atm", "50", "0.5", "0.9", "not held (too few rows)"],
    ]


def test_a_slice_guardrail_that_no_slice_reached_says_not_held_rather_than_nothing() -> None:
    evaluation = Evaluation(
        candidate={"roc_auc": 0.81},
        champion={"roc_auc": 0.8},
        slices=[
            SliceScore(slice="channel=atm", rows=50, candidate={"roc_auc": 0.5}, champion={"roc_auc": 0.9})
        ],
    )
    decision = _decision(slice_checks=[])
    guarded = gate_report_html(decision, evaluation, "binary_classification", slice_guardrail=True)
    assert _rows(guarded, "Slices")[1:] == [["channel=atm", "50", "0.5", "0.9", "not held (too few rows)"]]
    unguarded = gate_report_html(decision, evaluation, "binary_classification")
    assert _rows(unguarded, "Slices")[1:] == [["channel=atm", "50", "0.5", "0.9", "-"]]


def test_a_multiclass_report_shows_recall_per_class() -> None:
    evaluation = Evaluation(
        candidate={"macro_f1": 0.7, "recall_billing": 0.8, "recall_shipping": 0.6},
        champion={"macro_f1": 0.68, "recall_billing": 0.7, "recall_shipping": 0.65},
    )
    page = gate_report_html(
        _decision(metric="macro_f1", promote=True, reason="better"), evaluation, "multiclass_classification"
    )
    assert "<b>PROMOTE</b>: better" in page and "recall per class" in page
    assert ">billing<" in page and ">shipping<" in page


def test_a_ranking_report_draws_ndcg_and_map_at_k_and_a_bootstrap_without_a_champion_has_no_interval() -> (
    None
):
    metrics = {
        **{f"ndcg_at_{k}": 0.5 + k / 100 for k in (1, 3, 5, 10, 20)},
        "map_at_5": 0.4,
        "map_at_10": 0.45,
    }
    evaluation = Evaluation(candidate=metrics, champion=None)
    decision = _decision(
        metric="ndcg_at_10",
        champion=None,
        improvement=None,
        improvement_interval=None,
        confidence=None,
        promote=True,
        reason="no champion yet",
    )
    page = gate_report_html(decision, evaluation, "ranking")
    assert ">NDCG@k<" in page and ">MAP@k<" in page
    assert "Improvement interval" not in page and page.count("<svg") == 2
    assert _rows(page, "Every metric")[1] == ["ndcg_at_1", "0.51", "-", "-"]


@pytest.mark.parametrize("interval", [(-np.inf, np.inf), (0.002, 0.004)])
def test_an_unbounded_or_tiny_interval_still_draws(interval: tuple[float, float]) -> None:
    decision = _decision(improvement_interval=interval, min_improvement=0.001)
    page = gate_report_html(decision, Evaluation(candidate={"roc_auc": 0.81}), "regression")
    assert page.count("<svg") == 1 and "min_improvement 0.001" in page
