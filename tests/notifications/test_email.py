"""PipelineEmailNotifier: which event becomes which e-mail, sent through Airflow's SMTP notifier
and connection to a real SMTP server on 127.0.0.1 (aiosmtpd)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from airflow_trainpipe.config.notify import NotifySection
from airflow_trainpipe.notifications.deadline import deadline_missed
from airflow_trainpipe.notifications.email import PipelineEmailNotifier
from airflow_trainpipe.operators.validate import DataValidationFailed
from tests.helpers.smtp_server import SmtpServer

TO = ["ml-oncall@example.com", "owner@example.com"]


@pytest.fixture
def smtp(monkeypatch: pytest.MonkeyPatch) -> Iterator[SmtpServer]:
    with SmtpServer() as server:
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_TEST", server.connection_json())
        yield server


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


def test_the_mail_reaches_a_real_smtp_server(smtp: SmtpServer) -> None:
    notifier = PipelineEmailNotifier.for_event(_section(), "fraud_detector", "failure")
    notifier.notify(_context(DataValidationFailed("failed validation (drift: amount)")))
    mail = smtp.inbox.wait_for("data validation failed", timeout=10)
    assert sorted(mail.recipients) == sorted(TO) and mail.sender == "trainpipe@example.com"
    assert "drift: amount" in mail.html


def test_the_deadline_callback_sends_from_the_triggerer_context(smtp: SmtpServer) -> None:
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
    mail = smtp.inbox.wait_for("missed its deadline", timeout=10)
    assert "2026-01-03T08:00:00Z" in mail.html and "running" in mail.html


FACTORY_DAG = """
from pathlib import Path

from airflow_trainpipe.factory import register_pipelines

register_pipelines(Path(__file__).parent / "configs", globals())
dag = globals()["fraud_mail"]
"""


@pytest.mark.slow
def test_a_failed_validation_in_the_factory_dag_emails_the_recipients(
    migrated_airflow_db, tmp_path, smtp: SmtpServer
) -> None:
    """The pipeline as the factory builds it from a config with `notify`, in dag.test(): a day whose
    amounts are missing fails validation, and the e-mail arrives; nothing is trained."""
    from datetime import date

    from airflow_trainpipe.synthetic import Problem, write_day
    from tests.conftest import EXAMPLE_CONFIGS
    from tests.helpers.airflow_dags import dag_test_env, run_dag_file

    env = dag_test_env(tmp_path, migrated_airflow_db)
    env["AIRFLOW_CONN_SMTP_TEST"] = smtp.connection_json()
    home = tmp_path / "home"
    write_day(
        (home / "data" / "card_transactions").as_uri(),
        date(2026, 1, 3),
        2000,
        seed=3,
        problems=[Problem.parse("nulls:amount:0.2")],
    )
    text = (
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("pipeline: fraud_detector", "pipeline: fraud_mail")
    )
    text += "\nnotify:\n  email: [ml-oncall@example.com]\n  smtp_conn_id: smtp_test\n  from_email: trainpipe@example.com\n"
    (tmp_path / "dags" / "configs").mkdir()
    (tmp_path / "dags" / "configs" / "fraud_mail.yaml").write_text(text)

    run = run_dag_file(env, "fraud_mail_dag", FACTORY_DAG, logical_date="2026-01-03", timeout=300)

    assert run.tasks["validate_data"] == "failed" and run.tasks["train"] == "upstream_failed", run.output[
        -5000:
    ]
    assert run.tries["validate_data"] == 1
    mail = smtp.inbox.wait_for("fraud_mail: data validation failed", timeout=30)
    assert mail.recipients == ["ml-oncall@example.com"]
    assert "amount" in mail.html and "Nothing was trained" in mail.html
    assert len(smtp.inbox.received) == 1  # one failure, one e-mail: not also a generic "task failed"
