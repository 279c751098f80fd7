"""Approval through Airflow's human-in-the-loop REST API, and the e-mails on the way, with the
session's `airflow standalone` + `mlflow server` + SMTP server (conftest.py).

`fraud_approval` (conftest.approval_config) is fraud_detector with `register.approval: required`,
a `notify` section and a 1h deadline. Its first run waits in `approve` (awaiting_input) until the
test answers Approve through the REST API as a reviewer would, then `promote` makes version 1 the
champion. A second, forced run is answered Reject with a reason: nothing is promoted and the version
records who rejected it and why. Runs after test_standalone.py (file order); it registers into its
own model, so neither module sees the other's versions.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import APPROVAL_PIPELINE, Stack
from tests.integration.test_ui_browser import browser, page  # noqa: F401 (fixtures: Chromium, signed in)

pytestmark = pytest.mark.slow

DAG = APPROVAL_PIPELINE
RUN_TIMEOUT = 300
FAST = {
    "hyperparameters": {"epochs": 1, "batch_size": 64}
}  # clears the bootstrap floor (see test_standalone)


def _trigger(stack: Stack, run_id: str, logical_date: str, conf: dict) -> None:
    response = stack.session.post(
        f"{stack.url}/api/v2/dags/{DAG}/dagRuns",
        json={"dag_run_id": run_id, "logical_date": logical_date, "conf": conf},
        timeout=30,
    )
    assert response.status_code == 200, response.text


def _hitl_path(run_id: str) -> str:
    return f"/api/v2/dags/{DAG}/dagRuns/{run_id}/taskInstances/approve/-1/hitlDetails"


def _awaiting_approval(stack: Stack, run_id: str) -> dict:
    def parked():
        state = stack.task_states(DAG, run_id).get("approve")
        if state in ("failed", "upstream_failed", "skipped"):
            raise AssertionError(f"approve is {state}:\n{stack.task_report(DAG, run_id)}")
        return state == "awaiting_input"

    stack.wait_for(
        f"{run_id} to wait for approval", parked, RUN_TIMEOUT, lambda: stack.task_report(DAG, run_id)
    )
    # Airflow 3.3.2 race: the worker that parked the task exits with "success", and the task's
    # resumed run has the same key. If an answer resumes it before the scheduler has read that exit
    # event (seconds on 2 busy cores), the scheduler takes the event for the resumed run, finds it
    # "running" and fails it. A person answers later than that; the test waits for the scheduler.
    log = stack.airflow_home / "standalone.log"
    parked_exit = f"TaskInstance Finished: dag_id={DAG}, task_id=approve, run_id={run_id},"
    stack.wait_for(
        "the scheduler to see the parked worker exit",
        lambda: any(
            parked_exit in line and "state=awaiting_input" in line
            for line in log.read_text(errors="replace").splitlines()
        ),
        120,
    )
    return stack.get(_hitl_path(run_id))


def _answer(stack: Stack, run_id: str, option: str, reason: str) -> None:
    response = stack.session.patch(
        f"{stack.url}{_hitl_path(run_id)}",
        json={"chosen_options": [option], "params_input": {"reason": reason}},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert response.json()["responded_by"]["name"] == stack.username


def _required_action_is_shown(page, stack: Stack, run_id: str, subject: str) -> None:  # noqa: F811
    """What a reviewer sees: the request on the task's Required Actions page, with its buttons. The
    answer itself goes through the REST API (the next step), as an approval bot or a CLI would."""
    from playwright.sync_api import expect

    page.goto(f"{stack.url}/dags/{DAG}/runs/{run_id}/tasks/approve/required_actions")
    expect(page.get_by_text(subject).first).to_be_visible()
    expect(page.get_by_role("cell", name="roc_auc", exact=True).first).to_be_visible()  # the metric table
    # The reason is required: the answer stays disabled until the reviewer says why.
    buttons = [page.get_by_role("button", name=option, exact=True) for option in ("Approve", "Reject")]
    for button in buttons:
        expect(button).to_be_disabled()
    page.locator("input[name=element_reason]").fill("looked at the report")  # the Param `reason`
    for button in buttons:
        expect(button).to_be_enabled()


def test_approve_promotes_the_staged_version_and_everyone_hears_of_it(
    stack: Stack,
    monkeypatch: pytest.MonkeyPatch,
    page,  # noqa: F811
) -> None:
    stack.wait_for(f"DAG {DAG}", lambda: stack.dag(DAG), 120)
    response = stack.session.patch(f"{stack.url}/api/v2/dags/{DAG}", json={"is_paused": False}, timeout=30)
    assert response.status_code == 200, response.text
    _trigger(stack, "approval_1", "2026-01-03T02:00:00Z", FAST)

    detail = _awaiting_approval(stack, "approval_1")
    assert detail["subject"] == f"Promote {DAG} version 1 to @champion?"
    assert detail["options"] == ["Approve", "Reject"] and detail["defaults"] == ["Reject"]
    assert "passed the gate and waits at `@challenger`" in detail["body"]
    assert "| roc_auc |" in detail["body"] and "[Gate report](" in detail["body"]
    _required_action_is_shown(page, stack, "approval_1", detail["subject"])
    client = stack.mlflow_client(monkeypatch)
    assert {a: str(v) for a, v in client.get_registered_model(DAG).aliases.items()} == {"challenger": "1"}
    asked = stack.smtp.inbox.wait_for(f"{DAG}: approval needed", 60)
    assert asked.recipients == ["ml-oncall@example.com"]
    assert "required_actions" in asked.html  # the link to the request in the UI
    # The run of 2026-01-03 was due 1h after its logical date: the triggerer sent the alert.
    stack.smtp.inbox.wait_for(f"{DAG}: run approval_1 missed its deadline (1h)", 120)

    _answer(stack, "approval_1", "Approve", "holdout and slices look right")
    assert stack.wait_for_run(DAG, "approval_1", RUN_TIMEOUT) == "success"
    assert stack.task_states(DAG, "approval_1")["promote"] == "success"
    assert {a: str(v) for a, v in client.get_registered_model(DAG).aliases.items()} == {"champion": "1"}
    tags = client.get_model_version(DAG, "1").tags
    assert (tags["trainpipe.approved_by"], tags["trainpipe.approved_reason"]) == (
        stack.username,
        "holdout and slices look right",
    )
    assert tags["trainpipe.promoted_by"] == stack.username
    promoted = stack.smtp.inbox.wait_for(f"{DAG}: {DAG} version 1 is now @champion", 60)
    assert stack.username in promoted.html


def test_reject_keeps_the_champion_and_records_who_and_why(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Forced, so the gate hands version 2 to review whatever its numbers against version 1.
    # A few steps are enough: the forced gate promotes it whatever it scores.
    quick = {"hyperparameters": {**FAST["hyperparameters"], "max_steps": 5}, "force_registration": True}
    _trigger(stack, "approval_2", "2026-01-03T03:00:00Z", quick)
    detail = _awaiting_approval(stack, "approval_2")
    assert detail["subject"] == f"Promote {DAG} version 2 to @champion?"
    _answer(stack, "approval_2", "Reject", "recall on new merchants dropped")

    assert stack.wait_for_run(DAG, "approval_2", RUN_TIMEOUT) == "success"  # a decision, not a failure
    tasks = stack.task_states(DAG, "approval_2")
    assert (tasks["approve"], tasks["promote"]) == ("success", "skipped")
    client = stack.mlflow_client(monkeypatch)
    assert {a: str(v) for a, v in client.get_registered_model(DAG).aliases.items()} == {"champion": "1"}
    tags = client.get_model_version(DAG, "2").tags
    assert (tags["trainpipe.approval"], tags["trainpipe.rejected_by"]) == ("rejected", stack.username)
    assert tags["trainpipe.rejected_reason"] == "recall on new merchants dropped"
    assert not any("version 2 is now" in s for s in stack.smtp.inbox.subjects())
