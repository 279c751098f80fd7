"""The run's window as bounds of a table's time column, in the column's own type: what the table
sources (`delta`, `iceberg`) filter on (see `DeltaSource.time_column`).

A timestamp compares as an instant (one without a time zone is read as UTC); a date as its
midnight UTC, so the bounds are the first dates whose midnight is at or after the window's; a
string as ISO 8601 text in UTC, `YYYY-MM-DD` bounds when the window is whole days, else
`YYYY-MM-DDTHH:MM:SS`. Each source turns the bounds into its own filter (an Arrow expression, an
Iceberg row filter), so a partition column on the time column prunes files before they are read.
"""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Literal

from airflow_trainpipe.data.sources.errors import SourceError

if TYPE_CHECKING:
    from airflow_trainpipe.data.window import TimeWindow

TimeKind = Literal["timestamp", "timestamp_ntz", "date", "string"]
"""How a time column compares: an instant with a time zone, one without (read as UTC), a date,
ISO 8601 text."""


def _first_day_from(moment: datetime) -> date:
    """The first date whose midnight is at or after `moment` (a date compares as its midnight)."""
    day = moment.date()
    return day if moment.time() == datetime.min.time() else day + timedelta(days=1)


def _iso_text(moment: datetime, whole_days: bool) -> str:
    return moment.date().isoformat() if whole_days else moment.strftime("%Y-%m-%dT%H:%M:%S")


def bounds(
    kind: TimeKind, window: TimeWindow
) -> tuple[datetime, datetime] | tuple[date, date] | tuple[str, str]:
    """`[start, end)` of the window as values of a `kind` column: aware UTC datetimes, naive ones,
    dates, or ISO text."""
    start, end = window.start, window.end
    if kind == "timestamp":
        return start, end
    if kind == "timestamp_ntz":
        return start.replace(tzinfo=None), end.replace(tzinfo=None)
    if kind == "date":
        return _first_day_from(start), _first_day_from(end)
    whole = start.time() == end.time() == datetime.min.time()
    return _iso_text(start, whole), _iso_text(end, whole)


def refused(column: str, type_name: str, table: str) -> SourceError:
    """The error of a time column no window can be compared with."""
    return SourceError(
        f"data.source.time_column {column!r} of {table} is {type_name}; expected a timestamp, "
        "date or string column"
    )
