"""Shared config types: durations timedelta can hold, limits equal to Airflow's own."""

from __future__ import annotations

import pytest
from airflow.sdk.definitions.dag import TAG_MAX_LEN

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.config.types import DAG_TAG_MAX_LENGTH
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS

FRAUD = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()


def test_the_tag_limit_is_airflows() -> None:
    assert DAG_TAG_MAX_LENGTH == TAG_MAX_LEN


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1.0e+20", "99999999999d"])
def test_a_duration_timedelta_cannot_hold_is_a_located_problem(value: str) -> None:
    # Found by the property tests: OverflowError is not a ValueError, so pydantic let it through.
    with pytest.raises(ConfigError) as caught:
        parse_config(FRAUD.replace("retry_delay: 2m", f"retry_delay: {value}"), "x.yaml")
    [problem] = caught.value.problems
    assert str(problem).startswith(
        "x.yaml:13:16: schedule.retry_delay: expected a finite duration of at most 999999999 days, got "
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(3600, "1h"), (259200, "3d"), (90, "90s"), (120, "2m"), (5400, "90m"), (1.5, "1.5s")],
)
def test_short_duration_uses_the_largest_whole_unit(seconds: float, text: str) -> None:
    from datetime import timedelta

    from airflow_trainpipe.config.types import short_duration

    assert short_duration(timedelta(seconds=seconds)) == text
