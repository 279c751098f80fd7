"""canary/confidence.py: the intervals a canary step decides on, their coverage, and the requests
each check needs (the figures docs/canary.md and `trainpipe canary-replay` give)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from airflow_trainpipe.canary.confidence import (
    distance_decision,
    percentile_interval,
    requests_to_bound_percentile,
    requests_to_decide,
    share_decision,
    wilson_interval,
)
from tests.conftest import REPO_ROOT


def test_wilson_intervals_at_small_counts_and_at_the_ends() -> None:
    assert wilson_interval(5, 67, 0.95) == pytest.approx((0.03230, 0.16309), abs=1e-5)
    assert wilson_interval(0, 60, 0.95) == pytest.approx((0.0, 3.8415 / 63.8415), abs=1e-4)
    assert wilson_interval(60, 60, 0.95)[1] == 1.0 and wilson_interval(0, 0, 0.95) == (0.0, 1.0)
    # A threshold of 0 allows none: the first one fails it, none holds it.
    assert share_decision("error_rate", 0, 10, 0.0, 0.95).outcome == "holds"
    assert share_decision("error_rate", 1, 10_000, 0.0, 0.95).outcome == "fails"


def test_the_intervals_cover_the_truth_as_often_as_they_claim() -> None:
    rng = np.random.default_rng(7)
    trials, covered_share, covered_p95 = 2000, 0, 0
    true_p95 = -np.log(0.05)  # of an exponential(1)
    for _ in range(trials):
        low, high = wilson_interval(int(rng.binomial(200, 0.03)), 200, 0.95)
        covered_share += low <= 0.03 <= high
        sample = np.sort(rng.exponential(size=200))
        lower, upper = percentile_interval(sample.tolist(), 95, 0.95)
        covered_p95 += lower is not None and upper is not None and lower <= true_p95 <= upper
    assert covered_share / trials >= 0.93  # Wilson: close to 95%
    assert covered_p95 / trials >= 0.95  # order statistics: at least 95% (conservative)


def test_a_percentile_is_unbounded_where_too_few_requests_can_bound_it() -> None:
    latencies = [float(i) for i in range(1, 101)]
    assert percentile_interval(latencies, 99, 0.95) == (97.0, None)  # 100 < 368 requests
    assert requests_to_bound_percentile(99, 0.95) == 368
    low, high = percentile_interval([float(i) for i in range(1, 369)], 99, 0.95)
    assert low is not None and high == 368.0


def test_score_distance_fails_on_a_shift_and_holds_on_the_same_distribution() -> None:
    from airflow_trainpipe.canary.checks import ks_statistic

    rng = np.random.default_rng(1)
    same = ks_statistic(rng.normal(size=2000).tolist(), rng.normal(size=2000).tolist())
    shifted = ks_statistic(rng.normal(size=2000).tolist(), rng.normal(1.0, size=2000).tolist())
    assert distance_decision("score_distance", same, 2000, 2000, 0.2, 0.95).outcome == "holds"
    assert distance_decision("score_distance", shifted, 2000, 2000, 0.2, 0.95).outcome == "fails"
    assert distance_decision("score_distance", shifted, 40, 40, 0.2, 0.95).outcome == "undecided"


def test_the_docs_table_gives_the_requests_each_check_needs() -> None:
    text = (REPO_ROOT / "docs" / "canary.md").read_text()
    rows = re.findall(r"^\| (0\.\d+) \| (0\.\d+) \| ([\d,]+) \| ([\d,]+) \| ([\d,]+) \|$", text, re.M)
    assert len(rows) == 6
    for threshold, confidence, at_zero, at_half, at_twice in rows:
        t, c = float(threshold), float(confidence)
        expected = [requests_to_decide(rate, t, c) for rate in (0.0, t / 2, 2 * t)]
        assert [int(n.replace(",", "")) for n in (at_zero, at_half, at_twice)] == expected


def test_canary_replay_says_what_a_step_of_the_config_needs() -> None:
    from airflow_trainpipe.cli.canary import decision_lines
    from airflow_trainpipe.config import load_config
    from tests.conftest import EXAMPLE_CONFIGS

    lines = decision_lines(load_config(EXAMPLE_CONFIGS / "fraud_detector_canary.yaml"), per_second=1.0)
    assert lines[0].startswith("a step of 120 s at 1 requests/s collects about 120 requests")
    assert "  error_rate holds at 0 (threshold 0.01): 381 requests (more than a step)" in lines
    assert "  disagreement fails at 0.1: 66 requests" in lines
    assert "  latency_p99_ms an upper bound at all: 368 requests (more than a step)" in lines
