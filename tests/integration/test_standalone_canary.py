"""A canary that outlives its orchestrator: `airflow standalone` (scheduler, triggerer,
dag-processor, api-server) is stopped and started again while a canary step waits in the triggerer,
with real traffic on the router the whole time. Uses the session's stack (conftest.py).

`fraud_canary` is fraud_detector registering into a model of its own, with a canary of one 50% step.
Its first run has no champion to canary against and promotes version 1. Its second run serves
version 2 beside version 1; once step 1 is deferred the test restarts Airflow. What must hold:
- the step resumes where it was: the restarted triggerer runs the step's trigger again, rebuilt
  from its serialized, absolute window; the window is the same (its start kept in steps.json) and
  judged on the requests from before and after the restart; no canary task runs a second try;
- the serving set never noticed: the router and both model servers keep their pids, and no client
  request fails while Airflow is down;
- the run ends as it would have without the restart: version 2 becomes @champion.
"""

from __future__ import annotations

import json
import time

import pytest
import yaml

from airflow_trainpipe.canary.callers import CanaryCaller
from airflow_trainpipe.canary.local import LocalCanary
from airflow_trainpipe.config.canary import LocalServing
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.canary_models import day_rows
from tests.integration.conftest import PARTITION, Stack

pytestmark = pytest.mark.slow

DAG = "fraud_canary"
RUN_TIMEOUT = 300
STEP_SECONDS = 75  # long enough that Airflow is back before the step ends (restart: ~30-50 s here)
FAST = {
    "hyperparameters": {"epochs": 1, "batch_size": 64}
}  # clears the bootstrap floor (see test_standalone)
CANARY_TASKS = ("canary.start", "canary.step_1", "canary.promote")


def _config() -> str:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["pipeline"] = DAG
    config["register"]["model_name"] = DAG
    config["canary"] = {
        "steps": [50],
        "step_duration": f"{STEP_SECONDS}s",
        "poll_interval": "2s",
        "checks": {"min_requests": 20, "latency": {"percentile": 95, "max_ms": 3000}},
    }
    return yaml.safe_dump(config, sort_keys=False)


def _trigger(stack: Stack, run_id: str, hour: int, conf: dict) -> None:
    response = stack.session.post(
        f"{stack.url}/api/v2/dags/{DAG}/dagRuns",
        json={"dag_run_id": run_id, "logical_date": f"{PARTITION}T{hour:02d}:00:00Z", "conf": conf},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def _tries(stack: Stack, run_id: str) -> dict[str, int]:
    tasks = stack.get(f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances")["task_instances"]
    return {t["task_id"]: t["try_number"] for t in tasks if t["task_id"] in CANARY_TASKS}


def _triggerer_of_step(stack: Stack) -> int | None:
    """The id of the triggerer job running canary.step_1's trigger; None while it runs in none."""
    ti = stack.get(f"/api/v2/dags/{DAG}/dagRuns/canary_2/taskInstances/canary.step_1")
    if ti["state"] != "deferred":
        assert ti["state"] in ("scheduled", "queued", "running", None), stack.task_report(DAG, "canary_2")
        return None
    return (ti.get("triggerer_job") or {}).get("id")


def _requests_between(log_lines: list[str], since: float, until: float) -> int:
    return sum(since <= json.loads(line)["t"] < until for line in log_lines if line.strip())


def test_a_canary_step_resumes_where_it_was_after_airflow_restarts(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    (stack.configs / f"{DAG}.yaml").write_text(_config())
    stack.wait_for(f"DAG {DAG}", lambda: stack.dag(DAG), 180)
    response = stack.session.patch(f"{stack.url}/api/v2/dags/{DAG}", json={"is_paused": False}, timeout=30)
    assert response.status_code == 200, response.text

    # No champion yet: the canary is skipped and version 1 becomes the first champion.
    _trigger(stack, "canary_1", 4, FAST)
    assert stack.wait_for_run(DAG, "canary_1", RUN_TIMEOUT) == "success", stack.task_report(DAG, "canary_1")
    client = stack.mlflow_client(monkeypatch)
    assert str(client.get_model_version_by_alias(DAG, "champion").version) == "1"

    state = stack.home / "canary" / DAG / "v2"
    traffic = CanaryCaller(state, day_rows(stack.home, str(PARTITION)), per_second=50)
    traffic.start()
    try:
        # Forced past the gate: whether it beats version 1 is not what is tested here.
        _trigger(stack, "canary_2", 5, {**FAST, "force_registration": True})
        # Deferred, and its trigger running in the triggerer (not only written to the database).
        before_restart = stack.wait_for(
            "canary.step_1's trigger to run in the triggerer",
            lambda: _triggerer_of_step(stack),
            RUN_TIMEOUT,
            lambda: stack.task_report(DAG, "canary_2"),
        )
        since = json.loads((state / "steps.json").read_text())["1"]
        serving = json.loads((state / "deployment.json").read_text())
        stack.wait_for("requests in the step", lambda: len(traffic.statuses) >= 40, 60)

        stopped = time.time()
        stack.restart_airflow()
        back = time.time()
        assert back < since + STEP_SECONDS, (
            f"Airflow took {back - stopped:.0f}s to restart: the step was over"
        )
        # The new triggerer rebuilt the trigger from its serialized window.
        stack.wait_for(
            "the restarted triggerer to take canary.step_1's trigger",
            lambda: _triggerer_of_step(stack) not in (None, before_restart),
            60,
            lambda: stack.task_report(DAG, "canary_2"),
        )

        assert stack.wait_for_run(DAG, "canary_2", RUN_TIMEOUT) == "success", stack.task_report(
            DAG, "canary_2"
        )
        traffic.stop()
        after_promotion = json.loads((state / "deployment.json").read_text())
    finally:
        traffic.stopped.set()
        LocalCanary(state, LocalServing()).stop()

    # Where it was: one try of each canary task, the same window, the requests of both sides judged.
    assert _tries(stack, "canary_2") == dict.fromkeys(CANARY_TASKS, 1)
    assert json.loads((state / "steps.json").read_text()) == {"1": since}
    (verdict,) = json.loads((state / "verdicts.json").read_text())
    assert verdict["status"] == "held", verdict
    lines = (state / "requests.jsonl").read_text().splitlines()
    window = since + STEP_SECONDS
    before, after = _requests_between(lines, since, stopped), _requests_between(lines, back, window)
    assert before > 0 and after > 0, (before, after)
    # A request is logged once both models answered: the last second's may land after the verdict.
    judged = verdict["figures"]["requests"]
    assert _requests_between(lines, since, window - 1) <= judged <= _requests_between(lines, since, window)
    # Each check held on an interval over the requests of both sides of the restart.
    decided = {c["check"]: c for c in verdict["checks"]}
    assert {name: c["decision"] for name, c in decided.items()} == dict.fromkeys(decided, "holds"), decided
    assert decided["error_rate"]["requests"] == judged and decided["error_rate"]["interval"][1] < 0.01

    # The serving set never noticed: the same router and candidate server (the old champion's was
    # stopped by the promotion), and no request failed or went unanswered while Airflow was down.
    assert after_promotion.keys() == {"router", "candidate"}
    for role in after_promotion:
        assert after_promotion[role]["pid"] == serving[role]["pid"], role
    assert set(traffic.statuses) == {200} and traffic.unreachable == [], traffic.unreachable[:5]

    champion = client.get_model_version_by_alias(DAG, "champion")
    assert str(champion.version) == "2"
    assert champion.tags["trainpipe.canary.result"] == "promoted"
    assert json.loads(champion.tags["trainpipe.canary.step.1"])["error_rate"]["requests"] == judged
