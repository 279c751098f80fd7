"""Rolling windows: which partitions `data.window` spans for one run.

Airflow 3.3's partition windows (`airflow.sdk` RollupMapper with Day/Week/MonthWindow) roll up
fixed calendar periods, each upstream key feeding one downstream key; a window that slides with
every run ("the last 30 days") is not one of them. So the task computes it: the earlier
partitions are `data.partition` rendered with the run's dates moved back `every` at a time,
which also works for cron runs that have no partition key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.config.templates import date_context
from airflow_trainpipe.core.exceptions import TrainpipeError

if TYPE_CHECKING:
    from airflow_trainpipe.config.data import DataSection


class WindowError(TrainpipeError):
    """The window cannot be laid out for this run, or too few of its partitions exist."""


def moved_back(context: Mapping[str, Any], back: timedelta) -> dict[str, Any]:
    """The run's template context as a run `back` earlier would see it."""
    moved = dict(context)
    if context.get("logical_date") is not None:
        moved.update(date_context(context["logical_date"] - back))
        for name in ("data_interval_start", "data_interval_end"):
            if context.get(name) is not None:
                moved[name] = context[name] - back
    if context.get("partition_key"):
        moved["partition_key"] = _moved_key(str(context["partition_key"]), back)
    return moved


# The key formats of Airflow's temporal partition mappers and timetables, most specific last: an
# earlier partition's key keeps the run's key format, so the template renders it alike.
_KEY_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S")


def _moved_key(key: str, back: timedelta) -> str:
    for layout in _KEY_FORMATS:
        try:
            return (datetime.strptime(key, layout) - back).strftime(layout)
        except ValueError:
            continue
    try:  # other ISO 8601 spellings (an offset, fractions of a second)
        return (datetime.fromisoformat(key) - back).isoformat()
    except ValueError:
        raise WindowError(
            f"partition key {key!r} is not an ISO date or time, so data.window cannot count back from it"
        ) from None


def anchored(context: Mapping[str, Any], partition: str, render: Callable[[Mapping[str, Any]], str]) -> dict:
    """The run's context, or, when the run reads another partition than its own (a backfill
    chosen in the trigger form), the context of the date that renders that partition: the
    window then ends there. The date is looked for in the partition's text (2026-11-23 or
    20261123) and must render back to it exactly."""
    if context.get("logical_date") is None and not context.get("partition_key"):
        raise WindowError(
            "the run has neither a logical date nor a partition key for data.window to count back from"
        )
    if render(context) == partition:
        return dict(context)
    for text in re.findall(r"\d{4}-\d{2}-\d{2}|\d{8}", partition):
        try:
            day = datetime.strptime(text.replace("-", ""), "%Y%m%d").replace(tzinfo=UTC)
        except ValueError:
            continue
        candidate = {**context, **date_context(day, partition_key=bool(context.get("partition_key")))}
        if render(candidate) == partition:
            return candidate
    raise WindowError(
        f"partition {partition!r} is not what data.partition renders for any date in it, so the "
        "window has no end date; give a partition such as the template renders (ds=2026-01-05)"
    )


def window_partitions(
    context: Mapping[str, Any],
    partition: str,
    partitions: int,
    every: timedelta,
    render: Callable[[Mapping[str, Any]], str],
) -> list[str]:
    """The window's partitions, oldest first, ending at `partition` (the run's, rendered)."""
    end = anchored(context, partition, render)
    rendered = [render(moved_back(end, every * back)) for back in range(partitions - 1, 0, -1)]
    rendered.append(partition)
    if len(set(rendered)) != len(rendered):
        raise WindowError(
            f"data.partition renders the same partition for two dates of the window ending at "
            f"{partition!r}; check data.window.every against the template"
        )
    return rendered


def run_window(
    data: DataSection,
    context: Mapping[str, Any],
    partition: str,
    render_template: Callable[[str, Any], Any],
) -> list[str]:
    """The partitions one run reads, oldest first: `[partition]` without `data.window`.

    `partition` is the run's, rendered (the trigger form may have chosen it); `render_template`
    renders `data.partition` in a context (an operator's `render_template`, or the CLI's).
    """
    if data.window is None:
        return [partition]
    return window_partitions(
        context,
        partition,
        data.window.partitions,
        data.window.every,
        lambda moved: str(render_template(data.partition, moved)),
    )
