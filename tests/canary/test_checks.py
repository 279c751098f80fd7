from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trainpipe.canary.checks import Thresholds, judge, ks_statistic, read_step
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
    assert verdict.failed == ("latency p95 250.0 ms > 100 ms", "disagreement 1.0000 > 0.05 (60 of 60 rows)")


def test_a_step_holds_only_at_its_end(tmp_path: Path) -> None:
    figures = _figures(tmp_path, 60)
    assert judge(figures, CanaryChecks(), ended=False).holds is None
    assert judge(figures, CanaryChecks(), ended=True).holds is True


def test_score_distance_is_the_kolmogorov_smirnov_statistic() -> None:
    import numpy as np
    from scipy.stats import ks_2samp

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=300), rng.normal(0.3, size=200)
    b[:20] = a[:20]  # ties across the samples
    assert ks_statistic(a.tolist(), b.tolist()) == pytest.approx(ks_2samp(a, b).statistic)
    assert ks_statistic([], [1.0]) == 0.0
