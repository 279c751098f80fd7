"""config.schedule: cron expressions and presets, assets, dates, time zones and retry defaults."""

from __future__ import annotations

from datetime import date, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from airflow_trainpipe.config.schedule import CRON_PRESETS, ScheduleSection


def _schedule(**fields: Any) -> ScheduleSection:
    return ScheduleSection.model_validate({"start_date": "2026-01-01", **fields})


def _rejection(**fields: Any) -> tuple[str, str]:
    """(dotted field, message) of the only problem the schedule has."""
    with pytest.raises(ValidationError) as caught:
        _schedule(**fields)
    [error] = caught.value.errors()
    if error["type"] == "cross_field":
        [(loc, message)] = error["ctx"]["problems"]
        return ".".join(map(str, loc)), message
    return ".".join(map(str, error["loc"])), error["msg"].removeprefix("Value error, ")


def test_defaults_retry_twice_after_five_minutes_without_catchup() -> None:
    schedule = _schedule(cron="@daily")
    assert (schedule.timezone, schedule.catchup, schedule.max_active_runs) == ("UTC", False, 1)
    assert (schedule.retries, schedule.retry_delay) == (2, timedelta(minutes=5))
    assert schedule.end_date is None and schedule.dagrun_timeout is None


def test_cron_whitespace_is_normalised() -> None:
    assert _schedule(cron="  0   2 * *\t* ").cron == "0 2 * * *"


@pytest.mark.parametrize("preset", CRON_PRESETS)
def test_every_airflow_preset_is_accepted(preset: str) -> None:
    assert _schedule(cron=f" {preset} ").cron == preset


def test_an_unknown_preset_lists_the_known_ones() -> None:
    assert _rejection(cron="@Daily") == (
        "cron",
        "unknown preset '@Daily'; expected one of " + ", ".join(CRON_PRESETS),
    )


@pytest.mark.parametrize("cron", ["0 2 * * * *", "0 2 * *", "61 2 * * *", "0 2 * * mon-", "every day"])
def test_invalid_cron_expressions_show_the_expected_shape(cron: str) -> None:
    field, message = _rejection(cron=cron)
    assert field == "cron"
    assert message == (
        f"invalid cron expression {cron!r}; expected 5 fields "
        "'minute hour day-of-month month day-of-week', e.g. '0 2 * * *'"
    )


@pytest.mark.parametrize("cron", ["*/15 * * * *", "0 2 * * mon-fri", "30 6 1 */3 *"])
def test_ordinary_cron_expressions_are_accepted(cron: str) -> None:
    assert _schedule(cron=cron).cron == cron


@pytest.mark.parametrize("fields", [{}, {"cron": "@daily", "asset": "s3://bucket/x"}])
def test_exactly_one_trigger_is_set(fields: dict[str, str]) -> None:
    assert _rejection(**fields) == ("cron", "set exactly one of `cron` (time-based) or `asset` (data-aware)")


def test_asset_partitions_belong_to_an_asset_schedule() -> None:
    assert _schedule(asset="card_transactions_days", asset_partitions="day").asset_partitions == "day"
    assert _rejection(cron="@daily", asset_partitions="day") == (
        "asset_partitions",
        "runs per partition of an asset: set `asset` instead of `cron`",
    )
    field, message = _rejection(asset="x", asset_partitions="week")
    assert field == "asset_partitions" and "'key', 'hour' or 'day'" in message


@pytest.mark.parametrize("asset", ["", " ", "my asset", "s3://bucket/x\n"])
def test_an_asset_has_no_whitespace(asset: str) -> None:
    assert _rejection(asset=asset) == ("asset", f"an asset name or URI has no spaces, got {asset!r}")


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("2026-03-04", date(2026, 3, 4)),
        ("2026-03-04T05:06", datetime(2026, 3, 4, 5, 6)),
        ("2026-03-04 05:06:07", datetime(2026, 3, 4, 5, 6, 7)),
    ],
)
def test_quoted_iso_dates_and_datetimes_are_parsed(text: str, parsed: date) -> None:
    start = _schedule(asset="x", start_date=text).start_date
    assert start == parsed and type(start) is type(parsed)


@pytest.mark.parametrize("text", ["2026/01/01", "01-02-2026", "2026-02-30", "yesterday"])
def test_a_date_that_is_not_iso_is_explained(text: str) -> None:
    assert _rejection(asset="x", start_date=text) == (
        "start_date",
        f"expected an ISO date such as 2026-01-01, got {text!r}",
    )


def test_a_number_is_not_a_date() -> None:
    with pytest.raises(ValidationError) as caught:
        _schedule(asset="x", start_date=20260101)
    assert {e["type"] for e in caught.value.errors()} == {"date_type", "datetime_type"}


@pytest.mark.parametrize("end", ["2026-01-01", "2025-12-31", "2026-01-01T00:00"])
def test_the_end_date_must_be_after_the_start_date(end: str) -> None:
    field, message = _rejection(cron="@daily", end_date=end)
    assert field == "end_date" and message.endswith("is not after start_date 2026-01-01")


def test_an_end_date_later_the_same_day_is_after_a_start_date() -> None:
    assert _schedule(cron="@daily", end_date="2026-01-01T00:01").end_date == datetime(2026, 1, 1, 0, 1)


@pytest.mark.parametrize("zone", ["UTC", "Europe/Amsterdam", "America/Argentina/Buenos_Aires"])
def test_iana_time_zones_are_accepted(zone: str) -> None:
    assert _schedule(cron="@daily", timezone=zone).timezone == zone


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "CEST+1", "../etc/passwd", ""])
def test_unknown_time_zones_are_rejected(zone: str) -> None:
    assert _rejection(cron="@daily", timezone=zone) == (
        "timezone",
        f"unknown IANA time zone {zone!r}, e.g. 'UTC' or 'Europe/Paris'",
    )


@pytest.mark.parametrize("retries", [0, 100])
def test_retries_range_from_0_to_100(retries: int) -> None:
    assert _schedule(cron="@daily", retries=retries).retries == retries


@pytest.mark.parametrize(
    ("retries", "message"), [(101, "less than or equal to 100"), (-1, "greater than or equal to 0")]
)
def test_retries_outside_the_range_are_rejected(retries: int, message: str) -> None:
    assert _rejection(cron="@daily", retries=retries) == ("retries", f"Input should be {message}")


def test_a_zero_retry_delay_is_allowed_but_a_zero_run_timeout_is_not() -> None:
    assert _schedule(cron="@daily", retry_delay=0).retry_delay == timedelta(0)
    assert _rejection(cron="@daily", dagrun_timeout="0s") == (
        "dagrun_timeout",
        "expected a duration greater than zero, got 0s",
    )


@pytest.mark.parametrize(
    ("start", "end", "after"),
    [
        ("2026-01-01T01:00+00:00", "2026-01-01T02:00+05:00", False),  # 21:00 UTC the day before
        ("2026-01-01T02:00+05:00", "2026-01-01T01:00+00:00", True),  # 21:00 UTC vs 01:00 UTC
        ("2026-01-01T00:00", "2026-01-01T00:30+01:00", False),  # naive = the schedule's UTC
    ],
)
def test_end_and_start_dates_with_offsets_compare_as_instants(start: str, end: str, after: bool) -> None:
    try:
        _schedule(cron="@daily", start_date=start, end_date=end)
    except ValidationError as exc:
        assert not after and "is not after start_date" in str(exc)
    else:
        assert after
