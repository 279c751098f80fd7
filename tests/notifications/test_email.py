"""PipelineEmailNotifier: which event becomes which e-mail, sent through Airflow's SMTP notifier
and connection to a real SMTP server on 127.0.0.1 (aiosmtpd)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from airflow_trainpipe.config.notify import NotifySection
from airflow_trainpipe.notifications.deadline import deadline_missed
from airflow_trainpipe.notifications.email import PipelineEmailNotifier
from airflow_trainpipe.operators.validate import DataValidationFailed
from tests.helpers.smtp_server import SmtpServer

TO = ["ml-oncall@example.com", "owner@example.com"]


def _section(**overrides) -> NotifySection:
    return NotifySection.model_validate(
        {"email": TO, "smtp_conn_id": "smtp_test", "from_email": "trainpipe@example.com", **overrides}
    )


class _TaskInstance(SimpleNamespace):
    def xcom_pull(self, task_ids: str):
        return self.xcoms.get(task_ids)


def _context(exception: BaseException | None = None, xcoms: dict | None = None) -> dict:
    ti = _TaskInstance(
        task_id="validate_data",
        run_id="scheduled__2026-01-03T02:00:00+00:00",
        try_number=1,
        log_url="http://airflow.example/dags/fraud_detector/runs/r/tasks/validate_data?try_number=1",
        xcoms=xcoms or {},
    )
    return {"ti": ti, "task": SimpleNamespace(task_id=ti.task_id), "exception": exception}


def test_no_section_or_no_matching_event_means_no_notifier() -> None:
    assert PipelineEmailNotifier.for_event(None, "p", "failure") is None
    assert PipelineEmailNotifier.for_event(_section(events=["promotion"]), "p", "failure") is None
    # A failure callback also carries validation failures: subscribed to those alone, it exists.
    only_validation = PipelineEmailNotifier.for_event(_section(events=["validation_failure"]), "p", "failure")
    assert only_validation is not None
    assert only_validation.compose(_context(RuntimeError("disk full"))) is None
    assert only_validation.compose(_context(DataValidationFailed("drift: amount"))) is not None


def test_a_failed_validation_is_its_own_event_and_escapes_what_it_quotes() -> None:
    notifier = PipelineEmailNotifier.for_event(_section(), "fraud_detector", "failure")
    subject, body = notifier.compose(
        _context(DataValidationFailed("failed validation (drift: <amount>) {{ x }}"))
    )
    assert (
        subject == "[trainpipe] fraud_detector: data validation failed (scheduled__2026-01-03T02:00:00+00:00)"
    )
    assert "DataValidationFailed: failed validation (drift: &lt;amount&gt;) {{ x }}" in body
    assert "Nothing was trained" in body and "tasks/validate_data?try_number=1" in body
    subject, body = notifier.compose(_context(RuntimeError("node lost")))
    assert subject.startswith("[trainpipe] fraud_detector: task validate_data failed")
    assert "RuntimeError: node lost" in body


def test_promotion_mail_only_when_the_task_promoted() -> None:
    notifier = PipelineEmailNotifier.for_event(_section(), "fraud_detector", "promotion")
    staged = {"model_name": "fraud", "version": "4", "alias": "challenger", "promoted": False}
    assert notifier.compose(_context(xcoms={"validate_data": staged})) is None
    promoted = {
        **staged,
        "alias": "champion",
        "promoted": True,
        "previous_version": "3",
        "approved_by": "alice",
    }
    subject, body = notifier.compose(_context(xcoms={"validate_data": promoted}))
    assert subject == "[trainpipe] fraud_detector: fraud version 4 is now @champion"
    assert "version 3" in body and "alice" in body


def test_the_mail_reaches_a_real_smtp_server(smtp_server: SmtpServer) -> None:
    notifier = PipelineEmailNotifier.for_event(_section(), "fraud_detector", "failure")
    notifier.notify(_context(DataValidationFailed("failed validation (drift: amount)")))
    mail = smtp_server.inbox.wait_for("data validation failed", timeout=10)
    assert sorted(mail.recipients) == sorted(TO) and mail.sender == "trainpipe@example.com"
    assert "drift: amount" in mail.html


def test_the_deadline_callback_sends_from_the_triggerer_context(smtp_server: SmtpServer) -> None:
    # What the scheduler hands the triggerer: the run as the REST API shows it, and the deadline.
    context = {
        "dag_run": {
            "dag_run_id": "scheduled__2026-01-03",
            "logical_date": "2026-01-03T02:00:00Z",
            "state": "running",
        },
        "deadline": {"id": "d1", "deadline_time": "2026-01-03T08:00:00Z"},
    }
    subject = asyncio.run(
        deadline_missed(
            pipeline="fraud_detector",
            email=TO,
            smtp_conn_id="smtp_test",
            from_email="trainpipe@example.com",
            deadline="6h",
            context=context,
        )
    )
    assert subject == "[trainpipe] fraud_detector: run scheduled__2026-01-03 missed its deadline (6h)"
    mail = smtp_server.inbox.wait_for("missed its deadline", timeout=10)
    assert "2026-01-03T08:00:00Z" in mail.html and "running" in mail.html
