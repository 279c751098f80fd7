"""Airflow templates in a config: their syntax checked at parse time, the run's date names, and
rendering outside Airflow (the CLI, `trainpipe train --ds`).

The DAG renders `data.partition` and a `sql` source's query with Airflow's Jinja environment at
run time; a syntax error is caught here, when the config is parsed, instead of at the first run.
jinja2 is imported inside the functions (airflow.sdk has already loaded it at parse time).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

from airflow_trainpipe.core.exceptions import TrainpipeError


class TemplateError(TrainpipeError):
    """A template that cannot be rendered outside Airflow: it names a value only a DAG run has."""


def date_context(moment: datetime, *, partition_key: bool = False) -> dict[str, Any]:
    """The date names of a run at `moment`, as Airflow's context spells them (for a daily run)."""
    names: dict[str, Any] = {
        "ds": moment.strftime("%Y-%m-%d"),
        "ds_nodash": moment.strftime("%Y%m%d"),
        "ts": moment.isoformat(),
        "ts_nodash": moment.strftime("%Y%m%dT%H%M%S"),
        "logical_date": moment,
        "data_interval_start": moment,
        "data_interval_end": moment + timedelta(days=1),
    }
    if partition_key:
        names["partition_key"] = names["ds"]
    return names


def date_names(ds: str) -> dict[str, Any]:
    """The date names of a daily run on `ds` (YYYY-MM-DD), for a run outside Airflow."""
    return date_context(datetime.fromisoformat(ds).replace(tzinfo=UTC))


def render(template: str, context: Any) -> str:
    """Render a template outside Airflow, with the Airflow filters it commonly uses."""
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update({"ds": lambda d: d.strftime("%Y-%m-%d"), "ds_nodash": lambda d: d.strftime("%Y%m%d")})
    try:
        return env.from_string(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"cannot render partition {template!r} outside Airflow: {exc}") from exc


def render_partition(template: str, ds: str) -> str:
    """`data.partition` rendered for a run on `ds` outside Airflow (the CLI)."""
    return render(template, date_names(ds))


@cache
def template_syntax_error(template: str) -> str | None:
    """The problem with a template's syntax, None when Airflow's Jinja can parse it."""
    import jinja2

    try:
        _jinja().parse(template)
    except jinja2.TemplateSyntaxError as exc:
        return exc.message or str(exc)
    return None


@cache
def renders_one_path(template: str, every: timedelta) -> bool:
    """Whether the template renders alike for two runs `every` apart. A template the check
    cannot render alone (it reads `params` or `dag_run`) is left to the run."""
    import jinja2

    later = datetime(2026, 1, 31, tzinfo=UTC)
    compiled = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template)
    try:
        rendered = {compiled.render(date_context(t, partition_key=True)) for t in (later, later - every)}
    except Exception:  # any failure to render here is the run's to report
        return False
    return len(rendered) == 1


@cache
def _jinja() -> Any:
    import jinja2

    return jinja2.Environment()
