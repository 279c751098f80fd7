"""The gate's rule: may this candidate replace the champion? Pure functions, stdlib only.

Both metric sets come from the same evaluation (the training job scores the candidate and the
champion on the run's holdout with one function), so the numbers here are comparable.

Rules, in order:

- no champion: `gate.no_champion.action` (`promote`, `skip`, `fail`); `promote` also needs
  `min_value` when set (>= for metrics to maximise, <= for metrics to minimise).
- primary metric: the candidate must be strictly better, by at least `min_improvement`
  (absolute) and `min_relative_improvement` (relative to the champion's value).
- guardrails: a metric may not worsen by more than `max_regression` (absolute) and/or
  `max_relative_regression`. Each limit applies when it is given; an absolute limit that is
  not given applies (as 0) only when no relative limit is given either.
- not a number (NaN or infinite, e.g. ROC AUC on a holdout with one class, or a model whose
  predictions are NaN): a candidate whose primary metric is not a number is never promoted,
  bootstrap included. A champion whose primary metric is not a number on this holdout cannot
  be compared with and must not block every later promotion: it counts as no champion, so
  `gate.no_champion` decides (its action and `min_value`), and the reason says so. A guardrail
  that becomes NaN for the candidate counts as a regression.
- a constant predictor: a binary candidate whose threshold flags every holdout row or none
  (`predicted_positive_rate` 1 or 0) is never promoted on a metric that depends on the threshold
  (accuracy, precision, recall, f1), bootstrap included: that figure is what predicting one class
  for every row scores with no model. `max_f1` picks such a threshold on a near-random model,
  since flagging everything has recall 1.
- confidence (`gate.confidence`): with a champion to compare with, the lower bound of the
  bootstrap interval of the primary metric's improvement (computed by the training job on the
  same rows) must also be above 0 and clear `min_improvement`; otherwise the improvement is "not
  significant". No interval (an evaluation that did not compute one) is not significant either.
- slice guardrail (`gate.slice_guardrail`): on every slice of `evaluation.slices` with at least
  `min_rows` holdout rows, the slice's metric may not worsen by more than `max_regression`; the
  reason names each slice that does. A candidate whose run computed no slices fails it.
- `force`: promote whatever the rules say; the decision records what they said.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from airflow_trainpipe.config.catalog import METRICS, THRESHOLD_METRICS
from airflow_trainpipe.config.gate import GateSection, Guardrail
from airflow_trainpipe.contracts.payloads import GateDecision, GuardrailCheck, SliceCheck, SliceScore

# Differences this small are float noise of the metric computation, not a regression.
TOLERANCE = 1e-12


def _better_sign(direction: str) -> float:
    return 1.0 if direction == "maximize" else -1.0


def _relative(delta: float, reference: float) -> float:
    if abs(reference) > TOLERANCE:
        return delta / abs(reference)
    return 0.0 if abs(delta) <= TOLERANCE else math.copysign(math.inf, delta)


def check_guardrail(
    guardrail: Guardrail, direction: str, candidate: float, champion: float
) -> GuardrailCheck:
    max_abs = guardrail.absolute_limit
    max_rel = guardrail.max_relative_regression
    if math.isnan(champion):
        regression, relative, passed = math.nan, None, True  # nothing to regress from
    elif math.isnan(candidate):
        regression, relative, passed = math.inf, math.inf, False
    else:
        regression = _better_sign(direction) * (champion - candidate)  # > 0: the candidate is worse
        relative = _relative(regression, champion)
        passed = (max_abs is None or regression <= max_abs + TOLERANCE) and (
            max_rel is None or relative <= max_rel + TOLERANCE
        )
    return GuardrailCheck(
        metric=guardrail.metric,
        direction=direction,
        candidate=candidate,
        champion=champion,
        regression=regression,
        relative_regression=relative,
        max_regression=max_abs,
        max_relative_regression=max_rel,
        passed=passed,
    )


def decide(
    gate: GateSection,
    task: str,
    candidate: Mapping[str, float],
    champion: Mapping[str, float] | None,
    *,
    force: bool = False,
    interval: tuple[float, float] | None = None,
    slices: Sequence[SliceScore] | None = None,
) -> GateDecision:
    """`candidate` / `champion`: metric name -> value on the same holdout; champion None: none yet.
    `interval`: the bootstrap interval of the primary metric's improvement (gate.confidence).
    `slices`: both models' metrics per slice of the holdout (gate.slice_guardrail)."""
    direction = gate.direction or METRICS[task][gate.metric]
    value = candidate[gate.metric]
    decision = GateDecision(
        promote=False,
        reason="",
        metric=gate.metric,
        direction=direction,
        candidate=value,
        champion=None if champion is None else champion[gate.metric],
        min_improvement=gate.min_improvement,
        min_relative_improvement=gate.min_relative_improvement,
        confidence=gate.confidence,
        improvement_interval=interval if gate.confidence is not None else None,
    )
    if not math.isfinite(value):
        decision.reason = f"{gate.metric} of the candidate is not a number ({value}): a model that cannot be scored is never promoted"
    elif constant := _constant_prediction(task, gate.metric, candidate):
        decision.reason = constant
    elif champion is None:
        _bootstrap(gate, decision)
    elif not math.isfinite(champion[gate.metric]):
        _bootstrap(gate, decision)
        decision.reason = (
            f"the champion's {gate.metric} is not a number ({decision.champion}) on this holdout, so it counts "
            f"as no champion: {decision.reason}"
        )
    else:
        _compare(gate, task, candidate, champion, decision, slices)
    if force and not decision.promote:
        decision.promote, decision.forced, decision.fail = True, True, False
        decision.reason = f"forced promotion; the rules said: {decision.reason}"
    return decision


def _constant_prediction(task: str, metric: str, candidate: Mapping[str, float]) -> str | None:
    """Why a threshold metric proves nothing here: the candidate's threshold puts every holdout
    row in one class. None when it does not, or the metric does not depend on the threshold."""
    rate = candidate.get("predicted_positive_rate")
    if task != "binary_classification" or metric not in THRESHOLD_METRICS or rate not in (0.0, 1.0):
        return None
    which = "every holdout row" if rate == 1.0 else "no holdout row"
    threshold = candidate.get("threshold", math.nan)
    return (
        f"the candidate's threshold {threshold:.6g} flags {which}, so its {metric} {candidate[metric]:.6g} is "
        f"what predicting {int(rate)} for every row scores without a model: not promoted on a metric that "
        "depends on the threshold (gate on roc_auc or pr_auc, or fix evaluation.threshold)"
    )


def _bootstrap(gate: GateSection, decision: GateDecision) -> None:
    policy, value, metric = gate.no_champion, decision.candidate, decision.metric
    if policy.action == "skip":
        decision.reason = "no champion yet and no_champion.action is 'skip'"
    elif policy.action == "fail":
        decision.fail = True
        decision.reason = "no champion yet and no_champion.action is 'fail'"
    elif policy.min_value is None:
        decision.promote, decision.reason = True, f"no champion yet: bootstrap with {metric} = {value:.6g}"
    else:
        reached = value >= policy.min_value if decision.direction == "maximize" else value <= policy.min_value
        word = ">=" if decision.direction == "maximize" else "<="
        decision.promote = bool(reached)  # NaN compares False: not reached
        decision.reason = (
            f"no champion yet: {metric} = {value:.6g} {'reaches' if reached else 'does not reach'} "
            f"no_champion.min_value ({word} {policy.min_value:.6g})"
        )


def _compare(
    gate: GateSection,
    task: str,
    candidate: Mapping[str, float],
    champion: Mapping[str, float],
    decision: GateDecision,
    slices: Sequence[SliceScore] | None = None,
) -> None:
    metric, value, best = decision.metric, decision.candidate, decision.champion
    assert best is not None
    failures: list[str] = []
    improvement = _better_sign(decision.direction) * (value - best)  # both finite: decide() checked
    relative = _relative(improvement, best)
    decision.improvement, decision.relative_improvement = improvement, relative
    if improvement <= TOLERANCE:
        failures.append(f"{metric} {value:.6g} is not better than the champion's {best:.6g}")
    elif improvement < gate.min_improvement - TOLERANCE:
        failures.append(
            f"{metric} improves by {improvement:.6g}, less than min_improvement {gate.min_improvement:.6g}"
        )
    if improvement > TOLERANCE and relative < gate.min_relative_improvement - TOLERANCE:
        failures.append(
            f"{metric} improves by {relative:.4%}, less than min_relative_improvement {gate.min_relative_improvement:.4%}"
        )
    if gate.confidence is not None and (significance := _not_significant(gate, metric, decision)):
        failures.append(significance)
    if gate.slice_guardrail is not None:
        failures.extend(_slice_failures(gate, task, slices, decision))
    for guardrail in gate.guardrails:
        check = check_guardrail(
            guardrail,
            METRICS[task][guardrail.metric],
            candidate[guardrail.metric],
            champion[guardrail.metric],
        )
        decision.guardrails.append(check)
        if not check.passed:
            limits = " and ".join(
                text
                for text in (
                    None if check.max_regression is None else f"max_regression {check.max_regression:.6g}",
                    None
                    if check.max_relative_regression is None
                    else f"max_relative_regression {check.max_relative_regression:.4%}",
                )
                if text
            )
            rel = "" if check.relative_regression is None else f" ({check.relative_regression:.4%})"
            failures.append(
                f"guardrail {check.metric} worsens by {check.regression:.6g}{rel}: {check.candidate:.6g} vs "
                f"champion {check.champion:.6g}, allowed {limits}"
            )
    if failures:
        decision.reason = "; ".join(failures)
    else:
        decision.promote = True
        significant = ""
        if decision.improvement_interval is not None and gate.confidence is not None:
            low, high = decision.improvement_interval
            significant = f", {gate.confidence:.0%} interval [{low:.6g}, {high:.6g}]"
        decision.reason = (
            f"{metric} {value:.6g} beats the champion's {best:.6g} by {decision.improvement:.6g} "
            f"({decision.relative_improvement:.4%}{significant}); all guardrails hold"
            + (
                f", on the {len(decision.slice_checks)} slice(s) with enough rows too"
                if gate.slice_guardrail
                else ""
            )
        )


def _slice_failures(
    gate: GateSection, task: str, slices: Sequence[SliceScore] | None, decision: GateDecision
) -> list[str]:
    guardrail = gate.slice_guardrail
    assert guardrail is not None
    metric = guardrail.metric or gate.metric
    if slices is None:
        return [f"no slice metrics were computed for this candidate: slice_guardrail on {metric} cannot hold"]
    # Each slice is a guardrail on the slice's rows: the same regression rule as gate.guardrails.
    rule, direction, failures = (
        Guardrail(metric=metric, max_regression=guardrail.max_regression),
        METRICS[task][metric],
        [],
    )
    for scored in slices:
        if scored.rows < guardrail.min_rows or scored.champion is None:
            continue
        if math.isnan(scored.champion[metric]):
            continue  # nothing to regress from (one class on this slice)
        check = check_guardrail(rule, direction, scored.candidate[metric], scored.champion[metric])
        decision.slice_checks.append(
            SliceCheck(
                slice=scored.slice,
                rows=scored.rows,
                metric=metric,
                candidate=check.candidate,
                champion=check.champion,
                regression=check.regression,
                max_regression=guardrail.max_regression,
                passed=check.passed,
            )
        )
        if not check.passed:
            failures.append(
                f"slice {scored.slice} ({scored.rows} rows): {metric} worsens by {check.regression:.6g}, "
                f"{check.candidate:.6g} vs champion {check.champion:.6g}, "
                f"allowed max_regression {guardrail.max_regression:.6g}"
            )
    return failures


def _not_significant(gate: GateSection, metric: str, decision: GateDecision) -> str | None:
    """Why the improvement is not significant at gate.confidence, or None when it is."""
    interval, level = decision.improvement_interval, f"{gate.confidence:.0%}"
    if interval is None:
        return f"no {level} interval of the {metric} improvement was computed for this candidate: not significant"
    low, high = interval
    if low > TOLERANCE and low >= gate.min_improvement - TOLERANCE:  # min_improvement is >= 0
        return None
    bound = f"min_improvement {gate.min_improvement:.6g}" if gate.min_improvement > 0 else "0"
    return (
        f"not significant: the {level} interval of the {metric} improvement is [{low:.6g}, {high:.6g}], "
        f"its lower bound does not clear {bound}"
    )


def comparison_table(
    decision: GateDecision, candidate: Mapping[str, float], champion: Mapping[str, float] | None
) -> str:
    """Plain-text table of every metric, for the task log."""
    rows = [("metric", "candidate", "champion", "delta", "role")]
    roles = {decision.metric: "primary"} | {
        g.metric: "guardrail" + ("" if g.passed else " BREACHED") for g in decision.guardrails
    }
    order = [decision.metric, *(g.metric for g in decision.guardrails)]
    for name in sorted(candidate, key=lambda n: (order.index(n) if n in order else len(order), n)):
        theirs = None if champion is None else champion.get(name)
        delta = "" if theirs is None else f"{candidate[name] - theirs:+.6g}"
        rows.append(
            (
                name,
                f"{candidate[name]:.6g}",
                "-" if theirs is None else f"{theirs:.6g}",
                delta,
                roles.get(name, ""),
            )
        )
    lines = _aligned(rows)
    if decision.slice_checks:
        lines += ["", *_aligned(_slice_rows(decision))]
    verdict = (
        "PROMOTE" + (" (forced)" if decision.forced else "")
        if decision.promote
        else "FAIL"
        if decision.fail
        else "KEEP CHAMPION"
    )
    return "\n".join([*lines, f"decision: {verdict}: {decision.reason}"])


def _slice_rows(decision: GateDecision) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = [
        ("slice", "rows", "metric", "candidate", "champion", "regression", "check")
    ]
    for check in decision.slice_checks:
        rows.append(
            (
                check.slice,
                str(check.rows),
                check.metric,
                f"{check.candidate:.6g}",
                f"{check.champion:.6g}",
                f"{check.regression:+.6g}",
                "ok" if check.passed else f"BREACHED (max {check.max_regression:.6g})",
            )
        )
    return rows


def _aligned(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return lines
