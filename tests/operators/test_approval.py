"""ModelApprovalOperator against real MLflow: the request it shows, and the answer recorded on
the version: approved, rejected, or timed out."""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.sdk.definitions.retry_policy import RetryAction

from airflow_trainpipe.config import load_config
from airflow_trainpipe.operators.approval import ModelApprovalOperator, approval_body
from tests.helpers.mlflow_backends import gate_decision, write_config
from tests.operators.conftest import APPROVAL, TaskInstance, aliases, answer


def test_with_approval_register_only_stages_the_version(staged) -> None:
    hook, _, name, result, _ = staged
    assert (result["version"], result["alias"], result["promoted"]) == ("2", "challenger", False)
    assert aliases(hook, name) == {"champion": "1", "challenger": "2"}


def _operator(config, result, decision) -> tuple[ModelApprovalOperator, dict]:
    operator = ModelApprovalOperator(task_id="approve", config=config)
    ti = TaskInstance(
        xcoms={("register", "return_value"): result, ("gate", "return_value"): decision.as_dict()}
    )
    return operator, {"ti": ti, "task": operator}


def test_approve_records_who_and_why_and_leaves_the_aliases_to_promote(staged) -> None:
    hook, config, name, result, decision = staged
    operator, context = _operator(config, result, decision)
    payload = operator.execute_complete(context, answer("Approve", reason="canary looked fine"))
    assert payload["chosen_options"] == ["Approve"]
    tags = hook.get_conn().get_model_version(name, "2").tags
    assert (tags["trainpipe.approval"], tags["trainpipe.approved_by"]) == ("approved", "alice")
    assert tags["trainpipe.approved_reason"] == "canary looked fine" and tags["trainpipe.approved_at"]
    assert aliases(hook, name) == {"champion": "1", "challenger": "2"}


def test_reject_records_who_and_why_and_drops_the_staging_alias(staged) -> None:
    hook, config, name, result, decision = staged
    operator, context = _operator(config, result, decision)
    operator.execute_complete(context, answer("Reject", user="bob", reason="recall on EU cards dropped"))
    tags = hook.get_conn().get_model_version(name, "2").tags
    assert (tags["trainpipe.approval"], tags["trainpipe.rejected_by"]) == ("rejected", "bob")
    assert tags["trainpipe.rejected_reason"] == "recall on EU cards dropped"
    assert aliases(hook, name) == {"champion": "1"}


def test_a_timeout_is_recorded_as_such(staged) -> None:
    hook, config, name, result, decision = staged
    operator, context = _operator(config, result, decision)
    operator.execute_complete(context, answer("Reject", user=None, timedout=True))
    tags = hook.get_conn().get_model_version(name, "2").tags
    assert tags["trainpipe.rejected_by"] == "timeout"
    assert tags["trainpipe.rejected_reason"] == "no answer within 1h; register.on_approval_timeout is reject"


def test_an_unanswered_request_set_to_fail_fails_at_once_and_other_errors_are_retried(tmp_path: Path) -> None:
    """`approve` has the schedule's retries (a lost worker or an MLflow outage must not fail the
    run), but a request nobody answered in time is not asked again past its deadline."""
    from airflow.providers.standard.exceptions import HITLTimeoutError

    fail = ((*APPROVAL[0][:1], APPROVAL[0][1] + "\n  on_approval_timeout: fail"),)
    config = load_config(write_config(tmp_path / "a.yaml", "fraud", fail))
    operator = ModelApprovalOperator(task_id="approve", config=config, retries=2)
    # What the scheduler's timeout sweep resumes the task with when the request has no default.
    event = {
        "error": "The Human-in-the-loop response timeout has passed without a response.",
        "error_type": "timeout",
    }
    with pytest.raises(HITLTimeoutError) as unanswered:
        operator.execute_complete({"ti": TaskInstance(xcoms={}), "task": operator}, event)
    decision = operator.retry_policy.evaluate(unanswered.value, try_number=1, max_tries=3)
    assert decision.action == RetryAction.FAIL and "past it" in (decision.reason or "")
    outage = ConnectionError("MLflow at http://127.0.0.1:5000 refused the connection")
    assert operator.retry_policy.evaluate(outage, try_number=1, max_tries=3).action == RetryAction.DEFAULT


def test_the_request_shows_the_verdict_the_metrics_and_the_links(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path / "a.yaml", "fraud", APPROVAL))
    decision = gate_decision(
        champion_version="3",
        candidate=0.85,
        champion=0.8,
        improvement=0.05,
        reason="roc_auc +0.05",
        confidence=0.95,
        improvement_interval=(0.01, 0.09),
    )
    staged = {
        "model_name": "fraud",
        "version": "4",
        "model_version_url": "http://mlflow/#/models/fraud/versions/4",
    }
    body = approval_body(
        decision, staged, ({"roc_auc": 0.85, "recall": 0.5}, {"roc_auc": 0.8}), "http://r", config
    )
    assert body.startswith(
        "**fraud version 4** passed the gate and waits at `@challenger`; the champion is version 3."
    )
    assert "**Gate:** roc_auc +0.05" in body
    assert "improvement 0.05 (95% interval 0.01 .. 0.09)" in body
    assert "| roc_auc | 0.85 | 0.8 |\n| recall | 0.5 | - |" in body  # the primary metric first
    assert "[Gate report](http://r) · [Model version](http://mlflow/#/models/fraud/versions/4)" in body
    assert body.endswith("Without an answer within 1h: reject.")
