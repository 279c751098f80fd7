from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trainpipe.canary.checks import StepFigures, Thresholds, judge, ks_statistic, read_step
from airflow_trainpipe.config.canary import CanaryChecks, LatencyCheck


def _log(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def _request(t: float, role: str, status: int = 200, answer: float = 0.9, shadow: float = 0.9,
             shadow_status: int = 200, latency: float = 10.0) -> dict:  # fmt: skip
    return {
        "t": t, "percent": 5.0, "role": role, "status": status, "latency_ms": latency,
        "answer": [answer] if status == 200 else None, "shadow_status": shadow_status,
        "shadow_latency_ms": latency, "shadow": [shadow] if shadow_status == 200 else None,
    }  # fmt: skip


def test_the_candidate_is_judged_on_every_request_it_answered_or_shadow_scored(tmp_path: Path) -> None:
    # Champion answers 90, the candidate 10; the candidate fails 2 of its shadow scorings.
    records = [_request(i, "champion", shadow_status=500 if i < 2 else 200) for i in range(90)]
    records += [_request(100 + i, "candidate") for i in range(10)]
    figures = read_step(_log(tmp_path / "r.jsonl", records), since=0, until=None, thresholds=Thresholds())
    assert (figures.requests, figures.served, figures.errors) == (100, 10, 2)
    assert figures.error_rate == pytest.approx(0.02)
    assert figures.compared_rows == 98  # a failed answer compares nothing


def test_a_client_error_both_models_give_is_not_the_candidates(tmp_path: Path) -> None:
    both = [_request(i, "champion", status=400, shadow_status=400) for i in range(60)]
    only_candidate = [_request(100 + i, "champion", shadow_status=400) for i in range(3)]
    figures = read_step(_log(tmp_path / "r.jsonl", both + only_candidate), 0, None, Thresholds())
    assert (figures.requests, figures.errors) == (63, 3)


def test_disagreement_uses_each_models_own_threshold(tmp_path: Path) -> None:
    # Candidate 0.35 vs champion 0.6: both "positive" at thresholds 0.3 / 0.5, not at 0.5 / 0.5.
    records = [_request(i, "candidate", answer=0.35, shadow=0.6) for i in range(50)]
    log = _log(tmp_path / "r.jsonl", records)
    assert read_step(log, 0, None, Thresholds(champion=0.5, candidate=0.3)).disagreement == 0.0
    figures = read_step(log, 0, None, Thresholds())
    assert figures.disagreement == 1.0
    assert figures.examples[0] == {
        "t": 0, "row": 0, "champion": 0.6, "candidate": 0.35, "champion_label": 1, "candidate_label": 0,
    }  # fmt: skip
    assert len(figures.examples) == 5


def _answered(t: float, champion: object, candidate: object) -> dict:
    """A request the candidate answered, the champion shadow-scored: one row each."""
    return {"t": t, "percent": 50.0, "role": "candidate", "status": 200, "latency_ms": 5.0,
            "answer": [candidate], "shadow_status": 200, "shadow_latency_ms": 5.0, "shadow": [champion]}  # fmt: skip


def test_disagreement_reads_the_predicted_label_column_of_answers_that_have_one(tmp_path: Path) -> None:
    # Binary: the label each model served (at its own threshold, in its config), not a threshold
    # the canary applies: 0.35 labelled 1 by the candidate agrees with the champion's 0.6 labelled 1.
    binary = [
        _answered(0, {"probability": 0.6, "predicted_label": 1}, {"probability": 0.35, "predicted_label": 1}),
        _answered(1, {"probability": 0.6, "predicted_label": 1}, {"probability": 0.2, "predicted_label": 0}),
    ]
    figures = read_step(_log(tmp_path / "b.jsonl", binary), 0, None, Thresholds())
    assert (figures.compared_rows, figures.disagreements) == (2, 1)
    assert (figures.champion_scores, figures.candidate_scores) == ([0.6, 0.6], [0.35, 0.2])
    assert figures.examples[0]["champion_label"] == 1 and figures.examples[0]["candidate_label"] == 0
    # Multiclass: the served class, also beside an older champion's bare probabilities (its top class).
    multiclass = [
        _answered(0, {"billing": 0.7, "shipping": 0.3},
                  {"billing": 0.4, "shipping": 0.6, "predicted_label": "shipping"}),
        _answered(1, {"billing": 0.2, "shipping": 0.8, "predicted_label": "shipping"},
                  {"billing": 0.1, "shipping": 0.9, "predicted_label": "shipping"}),
    ]  # fmt: skip
    figures = read_step(_log(tmp_path / "m.jsonl", multiclass), 0, None, Thresholds())
    assert (figures.compared_rows, figures.disagreements) == (2, 1)
    assert figures.champion_scores == [] and figures.examples[0]["champion_label"] == "billing"
    # An older binary champion's bare P(class 1), at its version's threshold, beside a labelled answer.
    mixed = [_answered(0, 0.45, {"probability": 0.5, "predicted_label": 1})]
    assert read_step(_log(tmp_path / "x.jsonl", mixed), 0, None, Thresholds(champion=0.4)).disagreements == 0
    assert read_step(_log(tmp_path / "x.jsonl", mixed), 0, None, Thresholds(champion=0.5)).disagreements == 1


def test_a_step_reads_only_its_own_window(tmp_path: Path) -> None:
    log = _log(tmp_path / "r.jsonl", [_request(t, "candidate") for t in range(100)])
    assert read_step(log, since=10, until=20, thresholds=Thresholds()).requests == 10
    assert read_step(tmp_path / "missing.jsonl", 0, None, Thresholds()).requests == 0


def test_a_half_written_last_line_waits_for_the_next_read(tmp_path: Path) -> None:
    log = _log(tmp_path / "r.jsonl", [_request(0, "candidate")])
    with log.open("a") as handle:
        handle.write('{"t": 1, "role": "cand')
    assert read_step(log, 0, None, Thresholds()).requests == 1


def test_latency_is_the_nearest_rank_percentile(tmp_path: Path) -> None:
    records = [_request(i, "candidate", latency=float(i + 1)) for i in range(100)]
    figures = read_step(_log(tmp_path / "r.jsonl", records), 0, None, Thresholds())
    assert (figures.latency_ms(99), figures.latency_ms(50), figures.latency_ms(100)) == (99.0, 50.0, 100.0)


def _figures(tmp_path: Path, n: int, **request: object) -> object:
    return read_step(_log(tmp_path / "r.jsonl", [_request(i, "candidate", **request) for i in range(n)]),
                     0, None, Thresholds())  # fmt: skip


def test_too_few_requests_wait_and_then_fail_the_step(tmp_path: Path) -> None:
    checks = CanaryChecks(min_requests=50)
    few = _figures(tmp_path, 10, status=500)  # failing, but not enough evidence yet
    assert judge(few, checks, ended=False).holds is None
    verdict = judge(few, checks, ended=True)
    assert verdict.holds is False and "too little traffic to judge: 10 of 50" in verdict.failed[0]


def test_a_failing_check_fails_the_step_before_its_end(tmp_path: Path) -> None:
    checks = CanaryChecks(min_requests=50, latency=LatencyCheck(percentile=95, max_ms=100))
    verdict = judge(_figures(tmp_path, 60, latency=250.0, answer=0.1), checks, ended=False)
    assert verdict.holds is False
    assert verdict.failed == (
        "latency_p95_ms 250 [250, -] > 100 (60 requests)",  # 60 requests cannot bound a p95 above
        "disagreement 1 [0.9398, 1] > 0.05 (60 rows)",
    )


def test_a_step_holds_only_at_its_end_and_only_on_enough_requests(tmp_path: Path) -> None:
    # No error, no disagreement, 10 ms: at 60 requests the error rate's interval still reaches
    # 0.06 (> max_error_rate 0.01) and no p99 can be bounded from above; 400 requests decide both.
    few, enough = _figures(tmp_path, 60), _figures(tmp_path, 400)
    assert judge(enough, CanaryChecks(), ended=False).holds is None
    assert judge(enough, CanaryChecks(), ended=True).holds is True
    verdict = judge(few, CanaryChecks(), ended=True)
    assert verdict.holds is False
    assert verdict.failed == (
        "error_rate 0 [0, 0.06017] around 0.01: undecided at 60 requests",
        "latency_p99_ms 10 [10, -] around 500: undecided at 60 requests",
        "disagreement 0 [0, 0.06017] around 0.05: undecided at 60 rows",
    )
    assert judge(few, CanaryChecks(), ended=True, undecided="hold").holds is True


def test_score_distance_is_the_kolmogorov_smirnov_statistic() -> None:
    import numpy as np
    from scipy.stats import ks_2samp

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.normal(0.3, size=200)
    b[:20] = a[:20]  # ties across the samples
    assert ks_statistic(a.tolist(), b.tolist()) == pytest.approx(ks_2samp(a, b).statistic)
    assert ks_statistic([], [1.0]) == 0.0


def _disagreeing(rows: int, every: float) -> StepFigures:
    """Figures of `rows` clean requests of which one in `every` is a disagreement, evenly spread."""
    return StepFigures(
        requests=rows, served=rows, latencies_ms=[10.0] * rows, compared_rows=rows,
        disagreements=int(rows / every),
    )  # fmt: skip


def test_a_3_percent_candidate_seen_at_5_of_67_keeps_collecting_and_then_holds() -> None:
    checks = CanaryChecks(max_error_rate=None, latency=None, max_disagreement=0.05, min_requests=50)
    unlucky = StepFigures(requests=67, served=67, latencies_ms=[10.0] * 67, compared_rows=67, disagreements=5)
    verdict = judge(unlucky, checks, ended=False)  # 0.075 > 0.05, but its interval is [0.032, 0.163]
    assert verdict.holds is None and verdict.failed == ()
    [disagreement] = [d for d in verdict.checks if d.check == "disagreement"]
    assert (disagreement.low, disagreement.high) == pytest.approx((0.0323, 0.1631), abs=1e-4)
    # Collecting at its true 3%: undecided while the upper bound is above 5%, held once below.
    undecided = judge(_disagreeing(300, 1 / 0.03), checks, ended=True)
    assert undecided.failed == ("disagreement 0.03 [0.01586, 0.05602] around 0.05: undecided at 300 rows",)
    assert judge(_disagreeing(600, 1 / 0.03), checks, ended=True).holds is True


def test_an_8_percent_candidate_fails_once_the_lower_bound_clears_5_percent_and_not_before() -> None:
    from airflow_trainpipe.canary.confidence import wilson_interval

    checks = CanaryChecks(max_disagreement=0.05, min_requests=50)
    first_failure = None
    for rows in range(50, 2000):
        figures = StepFigures(
            requests=rows, served=rows, latencies_ms=[10.0] * rows, compared_rows=rows,
            disagreements=rows * 8 // 100,
        )  # fmt: skip
        verdict = judge(figures, checks, ended=False)
        low = wilson_interval(figures.disagreements, rows, 0.95)[0]
        assert (verdict.holds is False) == (low > 0.05), rows  # decided exactly by the interval
        if verdict.holds is False and first_failure is None:
            first_failure = rows
    assert first_failure is not None and 200 < first_failure < 500  # not at 0.08 > 0.05 alone


def test_a_30_percent_candidate_fails_at_min_requests() -> None:
    checks = CanaryChecks(max_disagreement=0.05, min_requests=50)
    assert judge(_disagreeing(49, 1 / 0.3), checks, ended=False).holds is None  # too few to judge
    verdict = judge(_disagreeing(50, 1 / 0.3), checks, ended=False)
    assert verdict.holds is False and verdict.failed[0].startswith("disagreement 0.3 [0.191")


def test_a_backends_own_latency_percentile_decides_alone() -> None:
    checks = CanaryChecks(max_error_rate=None, max_disagreement=None, min_requests=1)
    slow = StepFigures(requests=10, served=10, latency_at_percentile_ms=900.0)
    [latency] = judge(slow, checks, ended=False).checks
    assert (latency.outcome, latency.low, latency.high) == ("fails", None, None)
    assert judge(StepFigures(requests=10, served=10, latency_at_percentile_ms=90.0), checks, ended=True).holds
