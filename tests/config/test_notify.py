"""config.notify: recipients, events, and the SMTP connection; a deadline needs somewhere to go."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from airflow_trainpipe.config.loader import parse_config
from airflow_trainpipe.config.notify import NOTIFY_EVENTS, NotifySection
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS


def _errors(**data: Any) -> list[tuple[tuple[Any, ...], str]]:
    with pytest.raises(ValidationError) as caught:
        NotifySection.model_validate(data)
    return [(e["loc"], e["msg"]) for e in caught.value.errors(include_url=False)]


def test_every_event_by_default_through_smtp_default() -> None:
    section = NotifySection.model_validate({"email": ["ml@example.com"]})
    assert tuple(section.events) == NOTIFY_EVENTS
    assert (section.smtp_conn_id, section.from_email) == ("smtp_default", None)


def test_recipients_are_required_and_are_addresses() -> None:
    assert _errors(email=[])[0][0] == ("email",)
    [(loc, message)] = _errors(email=["ml@example.com", "Ops <ops@example.com>"])
    assert loc == ("email", 1) and "String should match pattern" in message


def test_an_unknown_event_lists_the_known_ones() -> None:
    [(loc, message)] = _errors(email=["ml@example.com"], events=["failure", "sucess"])
    assert loc == ("events", 1)
    assert "'failure', 'validation_failure', 'promotion', 'approval_needed' or 'deadline_missed'" in message


def _fraud(extra: str, schedule_extra: str = "") -> str:
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    return text.replace("  retry_delay: 2m\n", f"  retry_delay: 2m\n{schedule_extra}") + extra


def test_a_deadline_needs_a_notify_section_that_sends_it() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(_fraud("", "  deadline: 6h\n"), "fraud.yaml")
    [problem] = caught.value.problems
    assert problem.path == "schedule.deadline" and "deadline_missed" in problem.message
    with pytest.raises(ConfigError):
        parse_config(
            _fraud("notify:\n  email: [a@example.com]\n  events: [failure]\n", "  deadline: 6h\n"), "f.yaml"
        )
    config = parse_config(_fraud("notify:\n  email: [a@example.com]\n", "  deadline: 6h\n"), "fraud.yaml")
    assert config.schedule.deadline is not None and config.notify is not None
