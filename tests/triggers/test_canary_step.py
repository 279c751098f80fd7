"""CanaryStepTrigger on a request log the way the router writes it: it survives the triggerer's
serialize round trip, waits while the step is undecided, fails early on a failing check, holds
only at the step's end, and judges only its own window (a rebuilt trigger judges the same one)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from airflow.sdk.module_loading import import_string

from airflow_trainpipe.config.canary import CanaryChecks, LatencyCheck
from airflow_trainpipe.triggers.canary_step import CanaryStepTrigger
from tests.helpers.triggers import first_event

CLASSPATH = "airflow_trainpipe.triggers.canary_step.CanaryStepTrigger"


def _requests(log: Path, start: float, count: int, candidate_status: int = 200) -> None:
    with log.open("a") as handle:
        for i in range(count):
            record = {
                "t": start + i * 0.001, "percent": 5.0, "role": "champion", "status": 200, "latency_ms": 4.0,
                "answer": [0.2], "shadow_status": candidate_status, "shadow_latency_ms": 5.0,
                "shadow": [0.21] if candidate_status == 200 else None,
            }  # fmt: skip
            handle.write(json.dumps(record) + "\n")


def _trigger(log: Path, since: float, until: float) -> CanaryStepTrigger:
    # 80 clean requests decide each of these at 95%: 0 errors put the error rate below 0.05
    # (0.0458), 80 latencies bound a p95 from above.
    checks = CanaryChecks(min_requests=20, max_error_rate=0.05, latency=LatencyCheck(percentile=95))
    checks = checks.model_dump(mode="json")
    return CanaryStepTrigger(
        requests_log=str(log), since=since, until=until, checks=checks,
        thresholds={"champion": 0.5, "candidate": 0.5}, poll_interval=0.1,
    )  # fmt: skip


def test_serialize_round_trip(tmp_path: Path) -> None:
    classpath, kwargs = _trigger(tmp_path / "requests.jsonl", 1.0, 2.0).serialize()
    assert classpath == CLASSPATH
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert rebuilt.serialize() == (classpath, kwargs)


def test_a_step_holds_at_its_end_with_the_figures_of_its_window(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    now = time.time()
    _requests(log, now - 100, 500, candidate_status=500)  # an earlier step's failures: not this one's
    _requests(log, now, 80)
    assert first_event(_trigger(log, now, now + 60), timeout=1.0) is None  # undecided until its end
    event = first_event(_trigger(log, now, now + 1.0), timeout=10)
    assert event is not None and event["status"] == "held"
    assert event["figures"]["requests"] == 80 and event["figures"]["error_rate"] == 0.0
    assert event["failed"] == []
    assert [(c["check"], c["decision"], c["interval"][1]) for c in event["checks"]] == [
        ("error_rate", "holds", 0.045818), ("latency_p95_ms", "holds", 5.0), ("disagreement", "holds", 0.045818),
    ]  # fmt: skip


def test_a_failing_check_ends_the_step_early(tmp_path: Path) -> None:
    log = tmp_path / "requests.jsonl"
    now = time.time()
    _requests(log, now, 15)
    _requests(log, now + 0.5, 10, candidate_status=500)
    started = time.monotonic()
    event = first_event(_trigger(log, now, now + 3600), timeout=10)
    assert time.monotonic() - started < 5
    assert event is not None and event["status"] == "failed"
    assert event["failed"] == ["error_rate 0.4 [0.234, 0.5926] > 0.05 (25 requests)"]


def test_too_little_traffic_fails_the_step_at_its_end(tmp_path: Path) -> None:
    now = time.time()
    event = first_event(_trigger(tmp_path / "requests.jsonl", now, now + 0.5), timeout=10)
    assert event is not None and event["status"] == "failed"
    assert event["failed"] == ["too little traffic to judge: 0 of 20 requests"]


def test_a_trigger_rebuilt_after_a_restart_counts_the_same_requests(tmp_path: Path) -> None:
    # The triggerer (or the whole Airflow) restarts mid-step: the trigger is rebuilt from its
    # serialized arguments and reads the router's log again, so the counts and the intervals are
    # those it had, plus what arrived meanwhile, never a fresh start.
    log = tmp_path / "requests.jsonl"
    now = time.time()
    _requests(log, now, 40)
    _requests(log, now + 0.1, 3, candidate_status=500)
    before = _trigger(log, now, now + 3600)
    before.confidence, before.undecided = 0.9, "hold"
    checks = CanaryChecks.model_validate(before.checks)
    figures, verdict = before._judge(checks, ended=False)
    classpath, kwargs = before.serialize()
    rebuilt = import_string(classpath)(**json.loads(json.dumps(kwargs)))
    assert (rebuilt.confidence, rebuilt.undecided) == (0.9, "hold")
    again, same = rebuilt._judge(checks, ended=False)
    assert (again.requests, again.errors, again.compared_rows) == (figures.requests, figures.errors, 43 - 3)
    assert same.checks == verdict.checks and figures.requests == 43
