"""Rolling windows: the partitions one run spans, laid out from the run's dates."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import jinja2
import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.config.templates import date_context
from airflow_trainpipe.data.window import WindowError, run_partitions, window_partitions

RUN = datetime(2026, 3, 1, tzinfo=UTC)
DAY = timedelta(days=1)


def _render(template: str):
    compiled = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template)
    return lambda context: compiled.render(context)


def test_the_window_ends_at_the_run_and_crosses_month_ends() -> None:
    render = _render("ds={{ ds }}")
    assert window_partitions(date_context(RUN), "ds=2026-03-01", 3, DAY, render) == [
        "ds=2026-02-27",
        "ds=2026-02-28",
        "ds=2026-03-01",
    ]


def test_every_date_name_moves_back_together() -> None:
    render = _render("y={{ logical_date.year }}/d={{ ds_nodash }}/end={{ data_interval_end | string }}")
    context = {**date_context(RUN), "data_interval_end": RUN + DAY}
    first, second = window_partitions(context, render(context), 2, DAY, render)
    assert first == f"y=2026/d=20260228/end={RUN}"
    assert second == f"y=2026/d=20260301/end={RUN + DAY}"


def test_hourly_partitions_step_by_the_hour() -> None:
    render = _render("ts={{ ts_nodash }}")
    run = RUN.replace(hour=2)
    assert window_partitions(date_context(run), "ts=20260301T020000", 3, timedelta(hours=1), render) == [
        "ts=20260301T000000",
        "ts=20260301T010000",
        "ts=20260301T020000",
    ]


def test_a_dated_partition_key_counts_back_as_a_date() -> None:
    # An asset-triggered run carries the asset event's partition key and no logical date.
    render = _render("ds={{ partition_key }}")
    context = {"logical_date": None, "partition_key": "2026-03-01"}
    assert window_partitions(context, "ds=2026-03-01", 2, DAY, render) == ["ds=2026-02-28", "ds=2026-03-01"]


@pytest.mark.parametrize(
    ("key", "earlier"),
    [
        ("2026-03-01T05", "2026-03-01T04"),  # StartOfHourMapper's keys
        ("2026-03-01T05:00:00", "2026-03-01T04:00:00"),  # CronPartitionTimetable's keys
        ("2026-03-01T05:00:00+00:00", "2026-03-01T04:00:00+00:00"),
    ],
)
def test_an_hourly_partition_key_counts_back_in_its_own_format(key: str, earlier: str) -> None:
    render = _render("hour={{ partition_key }}")
    context = {"logical_date": None, "partition_key": key}
    assert window_partitions(context, f"hour={key}", 2, timedelta(hours=1), render) == [
        f"hour={earlier}",
        f"hour={key}",
    ]


def test_an_undated_partition_key_is_refused_by_name() -> None:
    render = _render("region={{ partition_key }}")
    with pytest.raises(WindowError, match="partition key 'emea' is not an ISO date"):
        window_partitions({"logical_date": None, "partition_key": "emea"}, "region=emea", 2, DAY, render)


def test_a_trigger_form_partition_moves_the_window_to_its_date() -> None:
    render = _render("ds={{ ds }}")
    assert window_partitions(date_context(RUN), "ds=2026-01-05", 2, DAY, render) == [
        "ds=2026-01-04",
        "ds=2026-01-05",
    ]


def test_a_partition_no_date_renders_to_has_no_window() -> None:
    with pytest.raises(WindowError, match=r"'latest' is not what data\.partition renders for any date"):
        window_partitions(date_context(RUN), "latest", 2, DAY, _render("ds={{ ds }}"))


def test_a_run_without_a_date_has_no_window() -> None:
    with pytest.raises(WindowError, match="neither a logical date nor a partition key"):
        window_partitions({"logical_date": None}, "ds=x", 2, DAY, _render("ds={{ ds }}"))


def test_an_every_finer_than_the_template_is_refused() -> None:
    # Hourly steps over a daily template would read each day 24 times.
    with pytest.raises(WindowError, match="renders the same partition for two dates"):
        window_partitions(date_context(RUN), "ds=2026-03-01", 3, timedelta(hours=1), _render("ds={{ ds }}"))


def test_no_window_is_the_run_partition_alone() -> None:
    data = DataSection.model_validate({"uri": "file:///d", "label": "y", "features": {"numeric": ["x"]}})
    assert run_partitions(data, {}, "ds=2026-03-01", lambda t, c: "unused") == ["ds=2026-03-01"]
