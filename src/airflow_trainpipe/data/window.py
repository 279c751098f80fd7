"""The run's window: the partitions a `files` source reads (`run_partitions`), or the period of
rows a `sql`, `delta` or `iceberg` source reads (`run_time_window`).

Airflow 3.3's partition windows (`airflow.sdk` RollupMapper with Day/Week/MonthWindow) roll up
fixed calendar periods, each upstream key feeding one downstream key; a window that slides with
every run ("the last 30 days") is not one of them. So the task computes it: the earlier
partitions are `data.partition` rendered with the run's dates moved back `every` at a time,
which also works for cron runs that have no partition key. A table source's window is a period
`[start, end)` of whole slots (days by default) ending with the run's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


def run_partitions(
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


@dataclass(frozen=True)
class TimeWindow:
    """The run's half-open period `[start, end)` of rows: the window of a `sql`, `delta` or
    `iceberg` source (a `files` source's window is a list of partitions, `run_partitions`)."""

    start: datetime
    end: datetime

    def names(self) -> dict[str, str]:
        """What the query template sees: complete, quoted SQL literals."""
        return {
            "window_start": f"'{self.start.isoformat()}'",
            "window_end": f"'{self.end.isoformat()}'",
            "window_start_date": f"'{self.start.date().isoformat()}'",
            "window_end_date": f"'{self.end.date().isoformat()}'",
        }


def run_time_window(
    data: DataSection, context: Mapping[str, Any], partition: str, render: Callable, slots: int | None = None
) -> TimeWindow:
    """The run's slot, or the `data.window.partitions` slots ending with it (`slots`: that many).

    A slot is `every` long (a day by default) and starts at the run's logical date floored to a
    multiple of `every` (midnight UTC for days, the hour for hours); a backfill's partition chosen
    in the trigger form moves it to the date that renders that partition."""
    end_context = anchored(context, partition, lambda moved: str(render(data.partition, moved)))
    moment = end_context.get("logical_date") or datetime.fromisoformat(str(end_context["ds"]))
    # A plain UTC datetime: Airflow's context holds pendulum's, whose intervals do not divide.
    moment = datetime.fromtimestamp(
        (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp(), UTC
    )
    every = data.window.every if data.window is not None else timedelta(days=1)
    count = slots or (data.window.partitions if data.window is not None else 1)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    end = epoch + every * ((moment - epoch) // every) + every
    return TimeWindow(start=end - every * count, end=end)


def partitions_for_date(data: DataSection, ds: str) -> list[str]:
    """The partitions a run on `ds` outside Airflow reads (the CLI), oldest first, as the DAG's
    run of that date would."""
    from airflow_trainpipe.config.templates import date_names, render

    names = date_names(ds)
    return run_partitions(data, names, render(data.partition, names), render)
