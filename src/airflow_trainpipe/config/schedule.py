"""`schedule`: when the pipeline runs, and the retry defaults of its tasks."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from functools import cache
from typing import Annotated, Any, Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BeforeValidator, Field, PositiveInt, field_validator, model_validator

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.types import Duration, PositiveDuration

# Airflow 3 timetable presets accepted in place of a cron expression.
CRON_PRESETS = (
    "@once",
    "@continuous",
    "@hourly",
    "@daily",
    "@weekly",
    "@monthly",
    "@quarterly",
    "@yearly",
    "@annually",
)


def _iso_date(value: Any) -> Any:
    """YAML gives a date for `2026-01-01`; a quoted string gets the same treatment."""
    if isinstance(value, str):
        try:
            return (
                datetime.fromisoformat(value) if "T" in value or " " in value else date.fromisoformat(value)
            )
        except ValueError:
            raise ValueError(f"expected an ISO date such as 2026-01-01, got {value!r}") from None
    return value


IsoDate = Annotated[date | datetime, BeforeValidator(_iso_date)]


class ScheduleSection(Section):
    """When the DAG runs: a cron expression or preset, or an Airflow asset (data-aware)."""

    cron: str | None = None
    """Cron expression (`0 2 * * *`) or preset (`@daily`, `@weekly`, ...). Exclusive with `asset`."""

    asset: str | None = None
    """Run whenever this Airflow asset (name or URI) is updated. Exclusive with `cron`."""

    asset_partitions: Literal["key", "hour", "day"] | None = None
    """With `asset`: one run per partition of the asset that lands (Airflow's partitioned assets),
    not one per update. The run has no logical date; its `partition_key` (and `partition_date`)
    are in the template context, e.g. `data.partition: "ds={{ partition_key }}"`. `key`: the
    upstream key as it is (`2026-01-03`); `hour` / `day`: upstream keys are ISO times
    (`2026-01-03T05:00:00`, what a `CronPartitionTimetable` producer emits), and the run's key is
    the hour (`2026-01-03T05`) or day (`2026-01-03`) each falls in. With `data.window`, the
    window ends at the run's key. null: every update of the asset starts a run."""

    start_date: IsoDate
    """First logical date the schedule covers (ISO date, `2026-01-01`)."""

    end_date: IsoDate | None = None
    """Optional last logical date."""

    timezone: str = "UTC"
    """IANA time zone the cron expression is read in."""

    catchup: bool = False
    """Create runs for intervals between `start_date` and now that were never run."""

    max_active_runs: PositiveInt = 1
    """Runs of this pipeline allowed at the same time (retraining is rarely safe to overlap)."""

    retries: int = Field(default=2, ge=0, le=100)
    """Default retries of every task; a retry of `train` resumes from its last checkpoint."""

    retry_delay: Duration = timedelta(minutes=5)
    """Wait before a retry: `30s`, `5m`, `1h`, or seconds."""

    retry_exponential_backoff: bool = False
    """Double the retry delay after each failed try."""

    dagrun_timeout: PositiveDuration | None = None
    """Fail a DAG run that takes longer than this."""

    deadline: PositiveDuration | None = None
    """Alert (`notify`'s `deadline_missed`) when a run has not finished this long after its logical
    date (Airflow's DeadlineAlert; the run goes on). E.g. `6h` for a nightly retrain due by 8am."""

    @field_validator("cron")
    @classmethod
    def _valid_cron(cls, value: str | None) -> str | None:
        if value is None:
            return value
        value = " ".join(value.split())
        if value.startswith("@"):
            if value not in CRON_PRESETS:
                raise ValueError(f"unknown preset {value!r}; expected one of {', '.join(CRON_PRESETS)}")
            return value
        if not _is_cron(value):
            raise ValueError(
                f"invalid cron expression {value!r}; expected 5 fields "
                "'minute hour day-of-month month day-of-week', e.g. '0 2 * * *'"
            )
        return value

    @field_validator("asset")
    @classmethod
    def _valid_asset(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or any(c.isspace() for c in value)):
            raise ValueError(f"an asset name or URI has no spaces, got {value!r}")
        return value

    @field_validator("timezone")
    @classmethod
    def _valid_timezone(cls, value: str) -> str:
        if not _is_timezone(value):
            raise ValueError(f"unknown IANA time zone {value!r}, e.g. 'UTC' or 'Europe/Paris'")
        return value

    @model_validator(mode="after")
    def _one_trigger(self) -> ScheduleSection:
        problems: FieldProblems = []
        if (self.cron is None) == (self.asset is None):
            problems.append((("cron",), "set exactly one of `cron` (time-based) or `asset` (data-aware)"))
        elif self.asset_partitions is not None and self.asset is None:
            problems.append(
                (("asset_partitions",), "runs per partition of an asset: set `asset` instead of `cron`")
            )
        end, start = self.end_date, self.start_date
        if end is not None and aware_datetime(end, self.timezone) <= aware_datetime(start, self.timezone):
            problems.append((("end_date",), f"{self.end_date} is not after start_date {self.start_date}"))
        field_problems(problems)
        return self


@cache
def _is_cron(expression: str) -> bool:
    # croniter is what Airflow's cron timetables use; imported here so that only the
    # processes validating a cron expression pay for it, once per distinct expression
    # (the DAG processor validates every config of a folder on every parse).
    from croniter import croniter

    return len(expression.split()) == 5 and croniter.is_valid(expression)


@cache
def _is_timezone(name: str) -> bool:
    # ZoneInfo looks up one zone; zoneinfo.available_timezones() walks the whole tz database.
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return False
    return True


def aware_datetime(value: date | datetime, tz: str) -> datetime:
    """A config date or datetime as Airflow reads it: naive ones (and dates, at midnight) are in
    the schedule's timezone; one with an offset keeps it."""
    if not isinstance(value, datetime):
        value = datetime(value.year, value.month, value.day)
    return value if value.tzinfo else value.replace(tzinfo=ZoneInfo(tz))
