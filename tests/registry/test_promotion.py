"""The gate's rules, one case each: both directions, absolute and relative minimums, guardrails,
bootstrap policies, NaN, force."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from airflow_trainpipe.config.gate import GateSection
from airflow_trainpipe.contracts.payloads import SliceScore
from airflow_trainpipe.registry.promotion import comparison_table, decide
from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics

CLS = "binary_classification"
REG = "regression"


def gate(**fields: Any) -> GateSection:
    return GateSection.model_validate(fields)


def cls_metrics(roc_auc: float, log_loss: float = 0.3, recall: float = 0.5) -> dict[str, float]:
    return {"roc_auc": roc_auc, "log_loss": log_loss, "recall": recall, "accuracy": 0.9}


def reg_metrics(rmse: float, r2: float = 0.8, mae: float = 1.0) -> dict[str, float]:
    return {"rmse": rmse, "r2": r2, "mae": mae, "mape": 0.1}


# -- primary metric ---------------------------------------------------------------------------


@pytest.mark.parametrize(("candidate", "promote"), [(0.81, True), (0.80, False), (0.79, False)])
def test_maximize_needs_a_strict_improvement(candidate: float, promote: bool) -> None:
    decision = decide(gate(metric="roc_auc"), CLS, cls_metrics(candidate), cls_metrics(0.80))
    assert decision.promote is promote
    assert decision.direction == "maximize"
    assert decision.improvement == pytest.approx(candidate - 0.80)


@pytest.mark.parametrize(("candidate", "promote"), [(9.0, True), (10.0, False), (11.0, False)])
def test_minimize_direction_follows_the_metric(candidate: float, promote: bool) -> None:
    decision = decide(gate(metric="rmse"), REG, reg_metrics(candidate), reg_metrics(10.0))
    assert decision.promote is promote
    assert decision.direction == "minimize"
    assert decision.improvement == pytest.approx(10.0 - candidate)


@pytest.mark.parametrize(("candidate", "promote"), [(0.8049, False), (0.8050, True), (0.81, True)])
def test_absolute_min_improvement_maximize(candidate: float, promote: bool) -> None:
    decision = decide(
        gate(metric="roc_auc", min_improvement=0.005), CLS, cls_metrics(candidate), cls_metrics(0.80)
    )
    assert decision.promote is promote, decision.reason
    if not promote:
        assert "less than min_improvement 0.005" in decision.reason


@pytest.mark.parametrize(("candidate", "promote"), [(9.51, False), (9.5, True), (9.0, True)])
def test_absolute_min_improvement_minimize(candidate: float, promote: bool) -> None:
    decision = decide(
        gate(metric="rmse", min_improvement=0.5), REG, reg_metrics(candidate), reg_metrics(10.0)
    )
    assert decision.promote is promote, decision.reason


@pytest.mark.parametrize(("candidate", "promote"), [(0.81, False), (0.82, True)])
def test_relative_min_improvement_maximize(candidate: float, promote: bool) -> None:
    # 0.80 -> 0.81 is +1.25%, 0.80 -> 0.82 is +2.5%; 2% required
    decision = decide(
        gate(metric="roc_auc", min_relative_improvement=0.02), CLS, cls_metrics(candidate), cls_metrics(0.80)
    )
    assert decision.promote is promote, decision.reason
    assert decision.relative_improvement == pytest.approx((candidate - 0.80) / 0.80)
    if not promote:
        assert "less than min_relative_improvement 2.0000%" in decision.reason


@pytest.mark.parametrize(("candidate", "promote"), [(9.95, False), (9.9, True)])
def test_relative_min_improvement_minimize(candidate: float, promote: bool) -> None:
    decision = decide(
        gate(metric="rmse", min_relative_improvement=0.01), REG, reg_metrics(candidate), reg_metrics(10.0)
    )
    assert decision.promote is promote, decision.reason


def test_both_minimums_apply() -> None:
    rules = gate(metric="rmse", min_improvement=0.05, min_relative_improvement=0.10)
    # 0.06 absolute is enough, but 0.06 of 1.0 is only 6% relative
    assert not decide(rules, REG, reg_metrics(0.94), reg_metrics(1.0)).promote
    assert decide(rules, REG, reg_metrics(0.89), reg_metrics(1.0)).promote


def test_nan_primary_metric_is_never_an_improvement() -> None:
    decision = decide(gate(metric="roc_auc"), CLS, cls_metrics(math.nan), cls_metrics(0.8))
    assert not decision.promote and "not a number" in decision.reason


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_candidate_that_cannot_be_scored_is_never_promoted_bootstrap_included(value: float) -> None:
    # house_prices.yaml: no_champion.action promote without min_value
    rules = gate(metric="rmse", no_champion={"action": "promote"})
    bootstrap = decide(rules, REG, reg_metrics(value), None)
    assert not bootstrap.promote and not bootstrap.fail
    assert "rmse of the candidate is not a number" in bootstrap.reason
    assert not decide(rules, REG, reg_metrics(value), reg_metrics(math.nan)).promote


def _collapsed_scores() -> tuple[np.ndarray, np.ndarray]:
    """A tenth of the rows positive and a model that collapsed to the base rate, scoring every row
    0.1: max_f1's only threshold flags every row (recall 1, precision 0.1), as the FOUND report saw."""
    labels = (np.random.default_rng(3).random(2_000) < 0.1).astype(np.int64)
    return labels, np.full(2_000, 0.1)


@pytest.mark.parametrize("metric", ["f1", "recall", "accuracy", "precision"])
def test_a_threshold_that_flags_every_row_is_never_promoted_on_a_threshold_metric(metric: str) -> None:
    labels, scores = _collapsed_scores()
    candidate = compute_metrics(CLS, labels, scores, threshold="max_f1")
    assert candidate["predicted_positive_rate"] == 1.0 and candidate["recall"] == 1.0  # the degenerate end
    champion = compute_metrics(CLS, labels, np.random.default_rng(4).random(2_000), threshold="max_f1")
    for against in (None, champion):  # bootstrap included
        decision = decide(gate(metric=metric), CLS, candidate, against)
        assert not decision.promote and not decision.fail
        assert decision.reason.startswith(
            f"the candidate's threshold {candidate['threshold']:.6g} flags every holdout row, so its {metric} "
        ), decision.reason
    # force still promotes, and records what the rule said
    forced = decide(gate(metric=metric), CLS, candidate, None, force=True)
    assert forced.promote and forced.forced and "flags every holdout row" in forced.reason


def test_a_threshold_that_flags_no_row_is_never_promoted_on_accuracy() -> None:
    # A tenth positive and a threshold above every score: accuracy ~0.9 is the majority class's.
    labels, scores = _collapsed_scores()
    candidate = compute_metrics(CLS, labels, scores, threshold=1.0)
    assert candidate["predicted_positive_rate"] == 0.0
    decision = decide(gate(metric="accuracy"), CLS, candidate, None)
    assert not decision.promote and "flags no holdout row" in decision.reason
    assert "predicting 0 for every row" in decision.reason


def test_the_ranking_metrics_of_such_a_candidate_are_still_gated_as_usual() -> None:
    # roc_auc does not depend on the threshold: a degenerate threshold is no reason to refuse.
    labels, scores = _collapsed_scores()
    candidate = compute_metrics(CLS, labels, scores, threshold="max_f1")
    decision = decide(gate(metric="roc_auc"), CLS, candidate, None)
    assert decision.promote and decision.reason.startswith("no champion yet: bootstrap with roc_auc")
    # and a threshold that splits the rows is gated on f1 as before
    split = compute_metrics(CLS, labels, np.where(labels == 1, 0.9, 0.1), threshold="max_f1")
    assert 0 < split["predicted_positive_rate"] < 1
    assert decide(gate(metric="f1"), CLS, split, candidate).promote


def test_a_champion_that_scores_nan_counts_as_no_champion() -> None:
    # A champion whose predictions became NaN must not block every later promotion.
    decision = decide(gate(metric="roc_auc"), CLS, cls_metrics(0.6), cls_metrics(math.nan))
    assert decision.promote, decision.reason
    assert decision.reason.startswith(
        "the champion's roc_auc is not a number (nan) on this holdout, so it counts as no champion: "
        "no champion yet: bootstrap with roc_auc = 0.6"
    )
    # ...and the bootstrap policy applies in full: its minimum, and skip / fail.
    floor = gate(metric="roc_auc", no_champion={"min_value": 0.7})
    assert not decide(floor, CLS, cls_metrics(0.6), cls_metrics(math.nan)).promote
    assert decide(floor, CLS, cls_metrics(0.75), cls_metrics(math.nan)).promote
    skip = decide(
        gate(metric="roc_auc", no_champion={"action": "skip"}), CLS, cls_metrics(0.9), cls_metrics(math.nan)
    )
    assert not skip.promote and "'skip'" in skip.reason
    assert decide(gate(metric="rmse"), REG, reg_metrics(3.0), reg_metrics(math.inf)).promote


# -- guardrails -------------------------------------------------------------------------------


def test_guardrail_absolute_regression_minimize_metric() -> None:
    rules = gate(metric="roc_auc", guardrails=[{"metric": "log_loss", "max_regression": 0.01}])
    within = decide(rules, CLS, cls_metrics(0.85, log_loss=0.309), cls_metrics(0.80, log_loss=0.30))
    beyond = decide(rules, CLS, cls_metrics(0.85, log_loss=0.311), cls_metrics(0.80, log_loss=0.30))
    assert within.promote and within.guardrails[0].passed
    assert not beyond.promote and not beyond.guardrails[0].passed
    assert beyond.guardrails[0].regression == pytest.approx(0.011)
    assert (
        "guardrail log_loss worsens by 0.011" in beyond.reason
        and "allowed max_regression 0.01" in beyond.reason
    )


def test_guardrail_absolute_regression_maximize_metric() -> None:
    rules = gate(metric="rmse", guardrails=[{"metric": "r2", "max_regression": 0.02}])
    assert decide(rules, REG, reg_metrics(9.0, r2=0.79), reg_metrics(10.0, r2=0.80)).promote
    assert not decide(rules, REG, reg_metrics(9.0, r2=0.77), reg_metrics(10.0, r2=0.80)).promote


def test_guardrail_default_allows_no_regression_but_improvement() -> None:
    rules = gate(metric="roc_auc", guardrails=[{"metric": "recall"}])
    assert decide(rules, CLS, cls_metrics(0.85, recall=0.6), cls_metrics(0.80, recall=0.5)).promote
    assert not decide(rules, CLS, cls_metrics(0.85, recall=0.4999), cls_metrics(0.80, recall=0.5)).promote


def test_guardrail_relative_only_ignores_the_absolute_default() -> None:
    rules = gate(metric="roc_auc", guardrails=[{"metric": "recall", "max_relative_regression": 0.05}])
    ok = decide(rules, CLS, cls_metrics(0.85, recall=0.48), cls_metrics(0.80, recall=0.50))  # -4%
    broken = decide(rules, CLS, cls_metrics(0.85, recall=0.47), cls_metrics(0.80, recall=0.50))  # -6%
    assert ok.promote, ok.reason
    assert ok.guardrails[0].max_regression is None
    assert not broken.promote and "max_relative_regression 5.0000%" in broken.reason


def test_guardrail_both_limits_apply_when_both_are_given() -> None:
    rules = gate(
        metric="roc_auc",
        guardrails=[{"metric": "recall", "max_regression": 0.01, "max_relative_regression": 0.05}],
    )
    # -0.02 absolute (> 0.01) although only -4% relative
    assert not decide(rules, CLS, cls_metrics(0.85, recall=0.48), cls_metrics(0.80, recall=0.50)).promote
    assert decide(rules, CLS, cls_metrics(0.85, recall=0.495), cls_metrics(0.80, recall=0.50)).promote


def test_guardrail_relative_regression_minimize_metric() -> None:
    rules = gate(metric="rmse", guardrails=[{"metric": "mae", "max_relative_regression": 0.10}])
    assert decide(rules, REG, reg_metrics(9.0, mae=1.09), reg_metrics(10.0, mae=1.0)).promote
    assert not decide(rules, REG, reg_metrics(9.0, mae=1.11), reg_metrics(10.0, mae=1.0)).promote


def test_guardrail_breach_blocks_even_a_large_primary_gain_and_all_failures_are_reported() -> None:
    rules = gate(
        metric="roc_auc",
        min_improvement=0.5,
        guardrails=[
            {"metric": "log_loss", "max_regression": 0.0},
            {"metric": "recall", "max_regression": 0.0},
        ],
    )
    decision = decide(rules, CLS, cls_metrics(0.95, log_loss=0.4, recall=0.4), cls_metrics(0.80))
    assert not decision.promote
    assert (
        "min_improvement" in decision.reason
        and "guardrail log_loss" in decision.reason
        and "guardrail recall" in decision.reason
    )


def test_guardrail_that_becomes_nan_is_a_regression() -> None:
    rules = gate(metric="roc_auc", guardrails=[{"metric": "recall", "max_regression": 1.0}])
    assert not decide(rules, CLS, cls_metrics(0.85, recall=math.nan), cls_metrics(0.80)).promote


# -- no champion ------------------------------------------------------------------------------


def test_bootstrap_promotes_by_default() -> None:
    decision = decide(gate(metric="roc_auc"), CLS, cls_metrics(0.55), None)
    assert decision.promote and decision.champion is None and "bootstrap" in decision.reason


@pytest.mark.parametrize(("value", "promote"), [(0.69, False), (0.70, True), (0.75, True)])
def test_bootstrap_min_value_maximize(value: float, promote: bool) -> None:
    rules = gate(metric="roc_auc", no_champion={"action": "promote", "min_value": 0.7})
    decision = decide(rules, CLS, cls_metrics(value), None)
    assert decision.promote is promote
    assert ("does not reach" in decision.reason) is not promote


@pytest.mark.parametrize(("value", "promote"), [(12.0, False), (10.0, True), (8.0, True)])
def test_bootstrap_min_value_minimize(value: float, promote: bool) -> None:
    rules = gate(metric="rmse", no_champion={"min_value": 10.0})
    assert decide(rules, REG, reg_metrics(value), None).promote is promote


def test_bootstrap_skip_and_fail() -> None:
    skip = decide(gate(metric="roc_auc", no_champion={"action": "skip"}), CLS, cls_metrics(0.9), None)
    fail = decide(gate(metric="roc_auc", no_champion={"action": "fail"}), CLS, cls_metrics(0.9), None)
    assert not skip.promote and not skip.fail and "'skip'" in skip.reason
    assert not fail.promote and fail.fail and "'fail'" in fail.reason


def test_bootstrap_nan_does_not_reach_min_value() -> None:
    assert not decide(
        gate(metric="roc_auc", no_champion={"min_value": 0.5}), CLS, cls_metrics(math.nan), None
    ).promote


# -- force, reporting -------------------------------------------------------------------------


def test_force_promotes_and_keeps_what_the_rules_said() -> None:
    decision = decide(gate(metric="roc_auc"), CLS, cls_metrics(0.70), cls_metrics(0.80), force=True)
    assert decision.promote and decision.forced
    assert decision.reason.startswith("forced promotion; the rules said: roc_auc 0.7 is not better")
    failing_bootstrap = decide(
        gate(metric="roc_auc", no_champion={"action": "fail"}), CLS, cls_metrics(0.7), None, force=True
    )
    assert failing_bootstrap.promote and failing_bootstrap.forced and not failing_bootstrap.fail


def test_force_on_a_winner_is_not_recorded_as_forced() -> None:
    decision = decide(gate(metric="roc_auc"), CLS, cls_metrics(0.85), cls_metrics(0.80), force=True)
    assert decision.promote and not decision.forced


def test_decision_dict_is_json_safe_and_the_table_names_every_metric() -> None:
    import json

    rules = gate(metric="roc_auc", guardrails=[{"metric": "log_loss", "max_regression": 0.0}])
    candidate, champion = cls_metrics(0.85, log_loss=0.35), cls_metrics(0.80, recall=math.nan)
    decision = decide(rules, CLS, candidate, champion)
    payload = json.loads(json.dumps(decision.as_dict(), allow_nan=False))
    assert payload["promote"] is False and payload["guardrails"][0]["metric"] == "log_loss"
    table = comparison_table(decision, candidate, champion)
    lines = table.splitlines()
    assert lines[0].split() == ["metric", "candidate", "champion", "delta", "role"]
    assert lines[2].split()[:2] == ["roc_auc", "0.85"] and lines[2].endswith("primary")
    assert "guardrail BREACHED" in lines[3] and lines[3].startswith("log_loss")
    assert lines[-1].startswith("decision: KEEP CHAMPION: guardrail log_loss worsens by 0.05")


# -- confidence -------------------------------------------------------------------------------


def test_with_confidence_a_point_improvement_whose_interval_reaches_zero_is_not_promoted() -> None:
    rules = gate(metric="roc_auc", confidence=0.95)
    decision = decide(rules, CLS, cls_metrics(0.85), cls_metrics(0.80), interval=(-0.004, 0.09))
    assert decision.promote is False
    assert decision.reason == (
        "not significant: the 95% interval of the roc_auc improvement is [-0.004, 0.09], "
        "its lower bound does not clear 0"
    )
    assert (decision.confidence, decision.improvement_interval) == (0.95, (-0.004, 0.09))


def test_with_confidence_the_lower_bound_must_clear_min_improvement() -> None:
    rules = gate(metric="rmse", confidence=0.9, min_improvement=0.5)
    decision = decide(rules, REG, reg_metrics(8.0), reg_metrics(10.0), interval=(0.3, 3.1))
    assert decision.promote is False and decision.reason.endswith("does not clear min_improvement 0.5")
    decision = decide(rules, REG, reg_metrics(8.0), reg_metrics(10.0), interval=(0.6, 3.1))
    assert decision.promote is True
    assert "(20.0000%, 90% interval [0.6, 3.1]); all guardrails hold" in decision.reason


def test_with_confidence_no_interval_is_not_significant() -> None:
    decision = decide(gate(metric="roc_auc", confidence=0.95), CLS, cls_metrics(0.9), cls_metrics(0.8))
    assert decision.promote is False
    assert (
        decision.reason
        == "no 95% interval of the roc_auc improvement was computed for this candidate: not significant"
    )
    infinite = decide(
        gate(metric="roc_auc", confidence=0.95),
        CLS,
        cls_metrics(0.9),
        cls_metrics(0.8),
        interval=(-math.inf, math.inf),
    )
    assert infinite.promote is False and "[-inf, inf]" in infinite.reason


def test_confidence_leaves_the_bootstrap_and_the_other_rules_alone() -> None:
    rules = gate(metric="roc_auc", confidence=0.95, guardrails=[{"metric": "log_loss"}])
    assert decide(rules, CLS, cls_metrics(0.7), None).promote is True  # no champion: nothing to compare
    breach = decide(rules, CLS, cls_metrics(0.9, log_loss=0.5), cls_metrics(0.8), interval=(0.05, 0.15))
    assert breach.promote is False and breach.reason.startswith("guardrail log_loss worsens")
    assert decide(gate(metric="roc_auc"), CLS, cls_metrics(0.9), cls_metrics(0.8), interval=(-1, 1)).promote


# -- slices -----------------------------------------------------------------------------------


def _slice(name: str, rows: int, ours: float, theirs: float | None) -> SliceScore:
    return SliceScore(
        slice=name,
        rows=rows,
        candidate=cls_metrics(ours),
        champion=None if theirs is None else cls_metrics(theirs),
    )


def test_a_candidate_better_overall_but_worse_on_a_slice_is_blocked_naming_the_slice() -> None:
    rules = gate(metric="roc_auc", slice_guardrail={"max_regression": 0.02, "min_rows": 100})
    slices = [_slice("channel=pos", 400, 0.86, 0.80), _slice("channel=web", 250, 0.70, 0.75)]
    decision = decide(rules, CLS, cls_metrics(0.85), cls_metrics(0.80), slices=slices)
    assert decision.promote is False
    assert decision.reason == (
        "slice channel=web (250 rows): roc_auc worsens by 0.05, 0.7 vs champion 0.75, allowed max_regression 0.02"
    )
    assert [(c.slice, c.passed) for c in decision.slice_checks] == [
        ("channel=pos", True),
        ("channel=web", False),
    ]


def test_small_slices_are_reported_but_not_held_to_the_bound() -> None:
    rules = gate(metric="roc_auc", slice_guardrail={"max_regression": 0.0, "min_rows": 100})
    slices = [_slice("country=IS", 40, 0.5, 0.9), _slice("country=FR", 900, 0.86, 0.85)]
    decision = decide(rules, CLS, cls_metrics(0.85), cls_metrics(0.80), slices=slices)
    assert decision.promote is True and decision.reason.endswith("on the 1 slice(s) with enough rows too")
    assert [c.slice for c in decision.slice_checks] == ["country=FR"]


def test_a_slice_guardrail_can_watch_another_metric_in_its_own_direction() -> None:
    rules = gate(metric="roc_auc", slice_guardrail={"metric": "log_loss", "max_regression": 0.01})
    worse = SliceScore(
        slice="channel=atm",
        rows=500,
        candidate=cls_metrics(0.9, log_loss=0.40),
        champion=cls_metrics(0.8, log_loss=0.35),
    )
    decision = decide(rules, CLS, cls_metrics(0.85), cls_metrics(0.80), slices=[worse])
    assert decision.promote is False and decision.reason.startswith(
        "slice channel=atm (500 rows): log_loss worsens by 0.05"
    )


def test_without_slice_scores_the_slice_guardrail_cannot_hold() -> None:
    rules = gate(metric="roc_auc", slice_guardrail={})
    decision = decide(rules, CLS, cls_metrics(0.85), cls_metrics(0.80))
    assert decision.promote is False
    assert (
        decision.reason
        == "no slice metrics were computed for this candidate: slice_guardrail on roc_auc cannot hold"
    )
    assert decide(rules, CLS, cls_metrics(0.85), None).promote is True  # bootstrap: nothing to compare


def test_the_comparison_table_lists_the_slices_checked() -> None:
    rules = gate(metric="roc_auc", slice_guardrail={"max_regression": 0.02})
    slices = [_slice("channel=pos", 400, 0.86, 0.80), _slice("channel=web", 250, 0.70, 0.75)]
    decision = decide(rules, CLS, cls_metrics(0.85), cls_metrics(0.80), slices=slices)
    table = comparison_table(decision, cls_metrics(0.85), cls_metrics(0.80)).splitlines()
    assert table[-5].split() == ["slice", "rows", "metric", "candidate", "champion", "regression", "check"]
    assert table[-3].split() == ["channel=pos", "400", "roc_auc", "0.86", "0.8", "-0.06", "ok"]
    assert table[-2].split() == [
        "channel=web",
        "250",
        "roc_auc",
        "0.7",
        "0.75",
        "+0.05",
        "BREACHED",
        "(max",
        "0.02)",
    ]
    assert table[-1].startswith("decision: KEEP CHAMPION: slice channel=web")
