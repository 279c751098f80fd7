"""The canary operators on a real registry, real `mlflow models serve` processes and the router:
start serves both versions, a step that fails rolls back (traffic, alias, tags) and is final, a
step's window survives a retry, and promote moves the champion."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException, TaskDeferred

from airflow_trainpipe.canary.local import _alive
from airflow_trainpipe.config import load_config
from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.operators.canary import (
    CanaryPromoteOperator,
    CanaryStartOperator,
    CanaryStepOperator,
    _backend,
    _step_window,
    canary_state,
)
from tests.conftest import fresh_mlflow_store
from tests.helpers.canary_models import log_scorer, request_body
from tests.helpers.mlflow_backends import gate_decision, write_config
from tests.operators.conftest import TaskInstance, aliases

pytestmark = pytest.mark.slow
CANARY = (
    ("tags: {team: risk-ml}", "tags: {team: risk-ml}\ncanary:\n  steps: [10, 100]\n  step_duration: 30s"),
)


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, migrated_mlflow_db: Path):
    """Version 1 (@champion, a good scorer) and version 2 (staged @canary) of a model of its own."""
    import mlflow

    store = tmp_path / "store"
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    uri = fresh_mlflow_store(store, migrated_mlflow_db)
    monkeypatch.setenv(
        "AIRFLOW_CONN_MLFLOW_DEFAULT", json.dumps({"conn_type": "mlflow", "extra": {"tracking_uri": uri}})
    )
    name = f"cnr_{uuid.uuid4().hex[:8]}"
    config = load_config(write_config(tmp_path / "canary.yaml", name, CANARY))
    hook = MlflowHook()

    def register(mode: str) -> str:
        with hook.activated():
            version = mlflow.register_model(log_scorer(store, mode), name).version
        return str(version)

    yield hook, config, name, register
    for state in (canary_state(config, "0").parent).glob("v*"):
        _backend(config, state.name[1:]).stop()


def _context(staged: dict, started: dict | None = None, decision: dict | None = None) -> dict:
    xcoms = {("register", "return_value"): staged, ("gate", "return_value"): decision}
    if started is not None:
        xcoms[("canary.start", "return_value")] = started
    return {"ti": TaskInstance(xcoms=xcoms)}


def _stage(hook: MlflowHook, name: str, champion: str, candidate: str) -> dict:
    client = hook.get_conn()
    client.set_registered_model_alias(name, "champion", champion)
    client.set_registered_model_alias(name, "canary", candidate)
    return {"model_name": name, "version": candidate, "mlflow_run_id": None, "model_version_url": None}


def _send(router: str, count: int) -> None:
    import urllib.error
    import urllib.request

    for row in range(1, count + 1):
        request = urllib.request.Request(
            f"{router}/invocations",
            data=request_body(row, row / 10 - 1),
            headers={"Content-Type": "application/json"},
        )
        with contextlib.suppress(urllib.error.HTTPError):  # the flaky model's failures are the point
            urllib.request.urlopen(request, timeout=30).read()


def test_a_failing_step_rolls_back_tags_the_version_and_is_final(registry, tmp_path: Path) -> None:
    hook, config, name, register = registry
    champion, candidate = register("good"), register("flaky")
    staged = _stage(hook, name, champion, candidate)
    with hook.activated():
        started = CanaryStartOperator(task_id="start", config=config).execute(_context(staged))
    assert (started["version"], started["champion_version"]) == (candidate, champion)
    step = CanaryStepOperator(task_id="step_1", step=1, config=config)
    with pytest.raises(TaskDeferred) as deferred:  # the step waits in the triggerer
        step.execute(_context(staged, started))
    trigger = deferred.value.trigger
    _send(started["router"], 80)
    time.sleep(1)  # the last shadow scorings land
    from tests.helpers.triggers import first_event

    event = first_event(trigger, timeout=30)
    assert event is not None and event["status"] == "failed"
    candidate_pid = _backend(config, candidate).deployment()["candidate"].pid
    with (
        hook.activated(),
        pytest.raises(AirflowFailException, match=r"canary step 1 \(10% of the traffic\) failed: error_rate"),
    ):
        step.execute_complete(_context(staged, started), event)
    assert not _alive(candidate_pid)
    assert aliases(hook, name) == {"champion": champion}  # @canary released, nothing promoted
    tags = hook.get_conn().get_model_version(name, candidate).tags
    assert tags["trainpipe.canary.result"] == "rolled_back" and tags["trainpipe.canary.failed_step"] == "1"
    assert tags["trainpipe.canary.failed"].startswith("error_rate")
    assert json.loads(tags["trainpipe.canary.figures"])["requests"] >= 20
    # How sure the step was: each check's interval and count, on the version.
    decided = json.loads(tags["trainpipe.canary.step.1"])
    assert decided["error_rate"]["decision"] == "fails" and decided["error_rate"]["interval"][0] > 0.01
    assert decided["error_rate"]["requests"] == json.loads(tags["trainpipe.canary.figures"])["requests"]
    # The report: on the version's run, named by a tag; traffic, the failed step and its figures.
    run_id = hook.get_conn().get_model_version(name, candidate).run_id
    assert (
        tags["trainpipe.canary.report"] == f"runs:/{run_id}/canary/report.html"
    )  # no UI URL: a SQLite store
    page = hook.get_conn().download_artifacts(run_id, "canary/report.html", str(tmp_path))
    text = Path(page).read_text()
    assert "ROLLED BACK" in text and "error_rate" in text and "<svg" in text
    assert "How sure each step was" in text


def test_a_retried_step_judges_the_window_it_started(tmp_path: Path) -> None:
    first = _step_window(tmp_path, 1)
    time.sleep(0.01)
    assert _step_window(tmp_path, 1) == first
    assert _step_window(tmp_path, 2) > first


def test_promote_moves_the_champion_and_the_first_model_needs_no_canary(registry) -> None:
    hook, config, name, register = registry
    first = register("good")
    staged = {"model_name": name, "version": first, "mlflow_run_id": None, "model_version_url": None}
    with hook.activated(), pytest.raises(AirflowSkipException, match="nothing to canary against"):
        CanaryStartOperator(task_id="start", config=config).execute(_context(staged))
    decision = gate_decision().model_dump(mode="json")
    with hook.activated():
        CanaryPromoteOperator(task_id="promote", config=config).execute(_context(staged, None, decision))
    assert aliases(hook, name) == {"champion": first}
    assert hook.get_conn().get_model_version(name, first).tags["trainpipe.canary.result"] == "no_champion"


def test_promote_after_a_skipped_canary_promotes_nothing_while_another_champion_holds(registry) -> None:
    hook, config, name, register = registry
    champion, candidate = register("good"), register("good")
    staged = _stage(hook, name, champion, candidate)
    decision = gate_decision(champion_version=champion).model_dump(mode="json")
    with (
        hook.activated(),
        pytest.raises(AirflowSkipException, match="did not run: @champion stays on version"),
    ):
        CanaryPromoteOperator(task_id="promote", config=config).execute(_context(staged, None, decision))
    assert aliases(hook, name)["champion"] == champion


def test_a_step_whose_trigger_timed_out_rolls_back_before_it_fails(registry) -> None:
    from airflow.sdk.exceptions import TaskDeferralTimeout

    hook, config, name, register = registry
    champion, candidate = register("good"), register("good")
    staged = _stage(hook, name, champion, candidate)
    with hook.activated():
        started = CanaryStartOperator(task_id="start", config=config).execute(_context(staged))
    step = CanaryStepOperator(task_id="step_1", step=1, config=config)
    candidate_pid = _backend(config, candidate).deployment()["candidate"].pid
    with hook.activated(), pytest.raises(TaskDeferralTimeout):
        # What the task runner calls when the triggerer let the deferral time out.
        step.resume_execution("__fail__", {"error": "Trigger timeout"}, _context(staged, started))
    assert not _alive(candidate_pid)
    assert aliases(hook, name) == {"champion": champion}
    assert (
        hook.get_conn()
        .get_model_version(name, candidate)
        .tags["trainpipe.canary.failed"]
        .startswith("no verdict from the triggerer: TaskDeferralTimeout")
    )
