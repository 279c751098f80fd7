"""A canary step's figures, read from the router's request log, and the verdict on them.

Every request is scored by both models (one answers, the other in the shadow), so the candidate is
judged on every request of the step, not only on its traffic share: its errors and latency where
it answered or shadow-scored, and its disagreement with the champion on exactly the same rows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow_trainpipe.canary.confidence import (
    CheckDecision,
    Outcome,
    distance_decision,
    latency_decision,
    share_decision,
)
from airflow_trainpipe.config.canary import CanaryChecks
from airflow_trainpipe.contracts.predictions import predicted_class, score, unwrap

EXAMPLES = 5  # disagreeing rows kept for the report


@dataclass(frozen=True)
class Thresholds:
    """Each model's decision threshold (binary: its own tuned threshold, from its version's tags),
    for an answer without its predicted label (a model logged before the label column)."""

    champion: float = 0.5
    candidate: float = 0.5


@dataclass
class StepFigures:
    requests: int = 0
    """Requests the candidate answered or shadow-scored (or failed to)."""
    served: int = 0
    """Of them, answered to a client by the candidate."""
    errors: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    compared_rows: int = 0
    disagreements: int = 0
    champion_scores: list[float] = field(default_factory=list)
    candidate_scores: list[float] = field(default_factory=list)
    examples: list[dict[str, Any]] = field(default_factory=list)
    latency_at_percentile_ms: float | None = None
    """The latency percentile as a backend measured it (CloudWatch), where no single request is seen."""
    latency_unreported: bool = False
    """The backend served requests but reported no latency percentile: the check cannot hold."""
    alarms: list[str] = field(default_factory=list)
    """The backend's alarms now in ALARM (SageMaker: the config's CloudWatch alarms)."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def latency_ms(self, percentile: float) -> float:
        if self.latency_at_percentile_ms is not None:
            return self.latency_at_percentile_ms
        return _percentile(self.latencies_ms, percentile)

    @property
    def disagreement(self) -> float:
        return self.disagreements / self.compared_rows if self.compared_rows else 0.0

    @property
    def score_distance(self) -> float:
        return ks_statistic(self.champion_scores, self.candidate_scores)

    def summary(self, checks: CanaryChecks) -> dict[str, Any]:
        figures: dict[str, Any] = {
            "requests": self.requests,
            "served_by_candidate": self.served,
            "error_rate": round(self.error_rate, 6),
            "compared_rows": self.compared_rows,
            "disagreement": round(self.disagreement, 6),
        }
        if checks.latency is not None:
            figures[f"latency_p{checks.latency.percentile:g}_ms"] = round(
                self.latency_ms(checks.latency.percentile), 3
            )
        if self.alarms:
            figures["alarms"] = self.alarms
        if self.champion_scores:
            figures["score_distance"] = round(self.score_distance, 6)
        return figures


@dataclass(frozen=True)
class Verdict:
    holds: bool | None
    """True: the step held; False: it failed; None: not decided yet (keep waiting)."""
    failed: tuple[str, ...] = ()
    """What failed, in words, e.g. `error_rate 0.12 [0.07, 0.2] > 0.01 (60 requests)`."""
    checks: tuple[CheckDecision, ...] = ()
    """Each check's figure, interval and decision (empty before `min_requests`)."""


def read_step(log: Path, since: float, until: float | None, thresholds: Thresholds) -> StepFigures:
    """The figures of the requests received in [since, until) (until None: up to now)."""
    figures = StepFigures()
    for record in _records(log):
        if record["t"] < since or (until is not None and record["t"] >= until):
            continue
        _add(figures, record, thresholds)
    return figures


def judge(
    figures: StepFigures,
    checks: CanaryChecks,
    ended: bool,
    confidence: float = 0.95,
    undecided: str = "fail",
) -> Verdict:
    """A check fails the step, even early, once it has `min_requests` and its interval lies above
    its threshold (canary/confidence.py). The step holds at its end when every check's interval
    lies below; a check still undecided then follows `undecided` (fail: nothing is promoted on
    doubt). An alarm in ALARM fails it at once, whatever the traffic."""
    if figures.alarms:
        return Verdict(False, tuple(figures.alarms))
    if figures.requests < checks.min_requests:
        if not ended:
            return Verdict(None)
        return Verdict(
            False, (f"too little traffic to judge: {figures.requests} of {checks.min_requests} requests",)
        )
    decisions = tuple(_decisions(figures, checks, confidence))
    failed = [d.describe() for d in decisions if d.outcome == "fails"]
    if checks.latency is not None and figures.latency_unreported:
        failed.append(
            f"latency p{checks.latency.percentile:g}: the backend reported none for {figures.requests} requests"
        )
    if failed:
        return Verdict(False, tuple(failed), decisions)
    if not ended:
        return Verdict(None, (), decisions)
    doubtful = [d.describe() for d in decisions if d.outcome == "undecided"]
    if doubtful and undecided == "fail":
        return Verdict(False, tuple(doubtful), decisions)
    return Verdict(True, (), decisions)


def _decisions(figures: StepFigures, checks: CanaryChecks, confidence: float) -> Iterator[CheckDecision]:
    if checks.max_error_rate is not None:
        yield share_decision(
            "error_rate", figures.errors, figures.requests, checks.max_error_rate, confidence
        )
    if checks.latency is not None and not figures.latency_unreported:
        percentile, max_ms = checks.latency.percentile, checks.latency.max_ms
        name, value = f"latency_p{percentile:g}_ms", figures.latency_ms(percentile)
        if figures.latency_at_percentile_ms is not None:
            # A backend's own percentile (CloudWatch): no single request to bound it by, so the
            # figure decides alone (and says so: no interval).
            outcome: Outcome = "fails" if value > max_ms else "holds"
            yield CheckDecision(name, value, None, None, max_ms, outcome, figures.requests)
        else:
            ordered = sorted(figures.latencies_ms)
            yield latency_decision(name, ordered, value, percentile, max_ms, confidence)
    if checks.max_disagreement is not None:
        yield share_decision(
            "disagreement", figures.disagreements, figures.compared_rows, checks.max_disagreement,
            confidence, "rows",
        )  # fmt: skip
    if checks.max_score_distance is not None:
        yield distance_decision(
            "score_distance", figures.score_distance, len(figures.champion_scores),
            len(figures.candidate_scores), checks.max_score_distance, confidence,
        )  # fmt: skip


def _records(log: Path) -> Iterator[dict[str, Any]]:
    try:
        handle = log.open()
    except FileNotFoundError:
        return
    with handle:
        for line in handle:
            if line.endswith("\n"):  # the router may be writing the last line right now
                yield json.loads(line)


def _add(figures: StepFigures, record: dict[str, Any], thresholds: Thresholds) -> None:
    primary = record["role"]
    shadowed = "shadow_status" in record
    if primary == "candidate":
        figures.served += 1
        _count_candidate(figures, record["status"], record["latency_ms"], record.get("shadow_status"))
    elif shadowed:
        _count_candidate(figures, record["shadow_status"], record["shadow_latency_ms"], record["status"])
    if not shadowed or record["answer"] is None or record["shadow"] is None:
        return
    candidate, champion = (
        (record["answer"], record["shadow"])
        if primary == "candidate"
        else (record["shadow"], record["answer"])
    )
    _compare(figures, champion, candidate, thresholds, record["t"])


def _count_candidate(
    figures: StepFigures, status: int, latency_ms: float, champion_status: int | None
) -> None:
    figures.requests += 1
    # A 4xx the champion gave too is the client's mistake; one only the candidate gives is its own.
    client_fault = 400 <= status < 500 and champion_status == status
    if status != 200 and not client_fault:
        figures.errors += 1
    if status == 200:
        figures.latencies_ms.append(latency_ms)


def _compare(
    figures: StepFigures, champion: list[Any], candidate: list[Any], thresholds: Thresholds, t: float
) -> None:
    """Both models' classes of each row (contracts/predictions.py: the answer's `predicted_label`),
    and their scores where an answer is one number (binary P(class 1), ranking, regression)."""
    for row, (old, new) in enumerate(zip(champion, candidate, strict=False)):
        old, new = unwrap(old), unwrap(new)
        old_score, new_score = score(old), score(new)
        if old_score is not None and new_score is not None:
            figures.champion_scores.append(old_score)
            figures.candidate_scores.append(new_score)
        figures.compared_rows += 1
        old_class = predicted_class(old, thresholds.champion)
        new_class = predicted_class(new, thresholds.candidate)
        if old_class != new_class:
            figures.disagreements += 1
            if len(figures.examples) < EXAMPLES:
                figures.examples.append(
                    {
                        "t": t,
                        "row": row,
                        "champion": old,
                        "candidate": new,
                        "champion_label": old_class,
                        "candidate_label": new_class,
                    }
                )


def _percentile(values: list[float], percentile: float) -> float:
    """Nearest-rank percentile: the value a share `percentile` of the requests are at or below."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(percentile / 100 * len(ordered)) - 1)]


def ks_statistic(first: Iterable[float], second: Iterable[float]) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: the largest gap between the empirical CDFs."""
    a, b = sorted(first), sorted(second)
    if not a or not b:
        return 0.0
    i = j = 0
    gap = 0.0
    while i < len(a) and j < len(b):
        value = min(a[i], b[j])
        while i < len(a) and a[i] == value:
            i += 1
        while j < len(b) and b[j] == value:
            j += 1
        gap = max(gap, abs(i / len(a) - j / len(b)))
    return gap


def traffic_over_time(log: Path, bins: int = 60) -> list[dict[str, Any]]:
    """Requests per interval by the model that answered, and the candidate's share then: the
    report's traffic chart (at most `bins` intervals over the whole canary)."""
    records = [(r["t"], r["role"], r["percent"]) for r in _records(log)]
    if not records:
        return []
    records.sort()
    start, end = records[0][0], records[-1][0]
    width = max((end - start) / bins, 1e-3)
    points: list[dict[str, Any]] = []
    for t, role, percent in records:
        index = min(int((t - start) / width), bins - 1)
        while len(points) <= index:
            points.append(
                {"t": start + len(points) * width, "champion": 0, "candidate": 0, "percent": percent}
            )
        points[index][role] += 1
        points[index]["percent"] = percent
    return points
