"""The `deadline_missed` e-mail: Airflow's DeadlineAlert calls this on its triggerer.

A DeadlineAlert callback is a module path, imported where it runs (the triggerer), with the
kwargs the DAG gave it plus a small context from the scheduler (the run as the REST API shows
it, and the deadline). It must be a coroutine: the triggerer awaits it.
"""

from __future__ import annotations

from typing import Any

CALLBACK_PATH = "airflow_trainpipe.notifications.deadline.deadline_missed"


async def deadline_missed(
    *,
    pipeline: str,
    email: list[str],
    smtp_conn_id: str,
    from_email: str | None,
    deadline: str,
    context: dict[str, Any] | None = None,
) -> str:
    """Send the alert; returns its subject (the triggerer records it as the callback's result)."""
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    from airflow_trainpipe.notifications.email import page_html

    run = (context or {}).get("dag_run") or {}
    due = ((context or {}).get("deadline") or {}).get("deadline_time")
    run_id = run.get("dag_run_id") or run.get("run_id") or "?"
    subject = f"[trainpipe] {pipeline}: run {run_id} missed its deadline ({deadline})"
    rows = [
        ("Pipeline", pipeline),
        ("Run", run_id),
        ("Logical date", run.get("logical_date") or "-"),
        ("Due", str(due or "-")),
        ("State", run.get("state") or "-"),
    ]
    note = "The run is not stopped by this alert; it goes on until it finishes or times out."
    body = page_html(subject, rows, note, ("", ""))
    async with SmtpHook(smtp_conn_id=smtp_conn_id) as hook:
        await hook.asend_email_smtp(to=email, subject=subject, html_content=body, from_email=from_email)
    return subject
