"""E-mail about a pipeline's runs: task failures, failed validations, promotions, approvals.

One notifier class serves every event so a pipeline's `notify` section maps onto Airflow's own
hooks without glue: it is a task's `on_failure_callback` / `on_success_callback` and the approval
task's `notifiers`. Sending goes through apache-airflow-providers-smtp's `SmtpNotifier` and an
SMTP connection, imported only when a message is sent: DAG files build these at parse time.

The message is composed here, not as a Jinja template: an exception text or a metric name that
happens to contain `{{` must reach the reader as written, not be rendered.
"""

from __future__ import annotations

from collections.abc import Iterable
from html import escape
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseNotifier

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_trainpipe.config.notify import NotifySection

SUBJECT_PREFIX = "[trainpipe]"


class PipelineEmailNotifier(BaseNotifier):
    """Send `event` of `pipeline` to the section's recipients, if the section subscribes to it.

    :param event: `failure` (becomes `validation_failure` when the exception is a failed
        validation), `promotion`, or `approval_needed`.
    """

    def __init__(
        self,
        *,
        pipeline: str,
        event: str,
        email: Iterable[str],
        events: Iterable[str],
        smtp_conn_id: str = "smtp_default",
        from_email: str | None = None,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.event = event
        self.email = list(email)
        self.events = frozenset(events)
        self.smtp_conn_id = smtp_conn_id
        self.from_email = from_email

    @classmethod
    def for_event(
        cls, section: NotifySection | None, pipeline: str, event: str
    ) -> PipelineEmailNotifier | None:
        """The notifier of `event`, or None when the section does not ask for it."""
        if section is None:
            return None
        # A failure callback also carries validation failures, which have an event of their own.
        covers = {"failure", "validation_failure"} if event == "failure" else {event}
        if not covers & set(section.events):
            return None
        return cls(
            pipeline=pipeline,
            event=event,
            email=section.email,
            events=section.events,
            smtp_conn_id=section.smtp_conn_id,
            from_email=section.from_email,
        )

    def notify(self, context: Context) -> None:
        message = self.compose(context)
        if message is None:
            return
        subject, body = message
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        SmtpNotifier(
            to=self.email,
            from_email=self.from_email,
            subject=subject,
            html_content=body,
            smtp_conn_id=self.smtp_conn_id,
        ).notify(context)
        self.log.info("sent %r to %s", subject, ", ".join(self.email))

    def compose(self, context: Context) -> tuple[str, str] | None:
        """(subject, HTML body) of this event in `context`; None when it is not to be sent."""
        event = self.event
        if event == "failure" and _is_validation_failure(_exception(context)):
            event = "validation_failure"
        if event not in self.events:
            return None
        if event == "promotion":
            return self._promotion(context)
        if event == "approval_needed":
            return self._approval(context)
        return self._failure(context, event)

    def _failure(self, context: Context, event: str) -> tuple[str, str]:
        ti = context["ti"]
        exception = _exception(context)
        what = "data validation failed" if event == "validation_failure" else f"task {ti.task_id} failed"
        subject = f"{SUBJECT_PREFIX} {self.pipeline}: {what} ({ti.run_id})"
        rows = [
            ("Pipeline", self.pipeline),
            ("Run", ti.run_id),
            ("Task", f"{ti.task_id} (try {ti.try_number})"),
            ("Error", f"{type(exception).__name__}: {exception}" if exception is not None else "-"),
        ]
        note = (
            "Nothing was trained on this data and nothing was registered."
            if event == "validation_failure"
            else "The task will not be retried again; the run has failed."
        )
        return subject, page_html(subject, rows, note, ("Task log", _log_url(ti)))

    def _promotion(self, context: Context) -> tuple[str, str] | None:
        ti = context["ti"]
        result = ti.xcom_pull(task_ids=ti.task_id) or {}
        if not result.get("promoted"):
            return None
        name, version, alias = result["model_name"], result["version"], result["alias"]
        subject = f"{SUBJECT_PREFIX} {self.pipeline}: {name} version {version} is now @{alias}"
        rows = [
            ("Pipeline", self.pipeline),
            ("Run", ti.run_id),
            ("Model", f"{name} version {version} (@{alias})"),
            ("Replaced", f"version {result['previous_version']}" if result.get("previous_version") else "-"),
            ("Approved by", result.get("approved_by") or "-"),
            ("Gate", result.get("gate_reason") or "-"),
        ]
        return subject, page_html(subject, rows, "", ("Model version", result.get("model_version_url") or ""))

    def _approval(self, context: Context) -> tuple[str, str]:
        ti, task = context["ti"], context["task"]
        subject = f"{SUBJECT_PREFIX} {self.pipeline}: approval needed ({getattr(task, 'subject', '')})"
        from airflow.providers.standard.operators.hitl import HITLOperator

        try:
            link = HITLOperator.generate_link_to_ui_from_context(context=context)
        except ValueError:  # not a HITL task, or no api.base_url configured: the task's page then
            link = _log_url(ti)
        rows = [("Pipeline", self.pipeline), ("Run", ti.run_id), ("Task", ti.task_id)]
        body = str(getattr(task, "body", "") or "")
        return subject, page_html(subject, rows, body, ("Required action", link), preformatted=True)


def _exception(context: Context) -> BaseException | None:
    exception = context.get("exception")
    return exception if isinstance(exception, BaseException) else None


def _is_validation_failure(exception: BaseException | None) -> bool:
    from airflow_trainpipe.operators.validate import DataValidationFailed

    return isinstance(exception, DataValidationFailed)


def _log_url(ti: Any) -> str:
    try:
        return str(ti.log_url)
    except Exception:  # a context without a configured API base URL
        return ""


def page_html(
    title: str,
    rows: list[tuple[str, str]],
    note: str,
    link: tuple[str, str],
    *,
    preformatted: bool = False,
) -> str:
    """A small HTML e-mail: a title, a table of (label, value), a note, an optional link."""
    cells = "".join(
        f"<tr><th align='left' style='padding-right:1em'>{escape(k)}</th><td>{escape(str(v))}</td></tr>"
        for k, v in rows
    )
    text = f"<pre>{escape(note)}</pre>" if preformatted else f"<p>{escape(note)}</p>"
    label, url = link
    anchor = f"<p><a href='{escape(url, quote=True)}'>{escape(label)}</a></p>" if url else ""
    return f"<html><body><h3>{escape(title)}</h3><table>{cells}</table>{text if note else ''}{anchor}</body></html>"
