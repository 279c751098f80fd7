"""`notify`: who hears about a run, and about what."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from airflow_trainpipe.config.base import FieldProblems, Section
from airflow_trainpipe.config.schedule import ScheduleSection

NotifyEvent = Literal["failure", "validation_failure", "promotion", "approval_needed", "deadline_missed"]
NOTIFY_EVENTS: tuple[NotifyEvent, ...] = (
    "failure",
    "validation_failure",
    "promotion",
    "approval_needed",
    "deadline_missed",
)

# One address per entry, as an SMTP server takes it: `name@domain`, no display name.
EmailAddress = Annotated[str, StringConstraints(pattern=r"^[^@\s,;<>]+@[^@\s,;<>]+\.[^@\s,;<>]+$")]


class NotifySection(Section):
    """E-mail through an Airflow SMTP connection (apache-airflow-providers-smtp's notifier).

    `failure`: a task failed for good (after its retries), except validation, which has its own
    event. `validation_failure`: the data failed its checks, nothing was trained. `promotion`: a
    version became the champion. `approval_needed`: a candidate waits in Required Actions
    (`register.approval: required`). `deadline_missed`: the run had not finished
    `schedule.deadline` after its logical date.
    """

    email: list[EmailAddress] = Field(min_length=1)
    """Recipients, e.g. `[ml-oncall@example.com]`."""

    events: list[NotifyEvent] = list(NOTIFY_EVENTS)
    """What to send: any of failure, validation_failure, promotion, approval_needed, deadline_missed."""

    smtp_conn_id: str = Field(default="smtp_default", min_length=1)
    """Airflow connection of the SMTP server (host, port, login, TLS/SSL, default sender)."""

    from_email: EmailAddress | None = None
    """Sender; default: the connection's `from_email` extra."""


def deadline_alert_problems(schedule: ScheduleSection, notify: NotifySection | None) -> FieldProblems:
    """A missed deadline is announced to someone: an alert that goes nowhere is a silent misconfiguration."""
    events = notify.events if notify is not None else []
    if schedule.deadline is not None and "deadline_missed" not in events:
        return [
            (
                ("schedule", "deadline"),
                "a missed deadline is announced by e-mail: add a `notify` section whose events "
                "include deadline_missed",
            )
        ]
    return []
