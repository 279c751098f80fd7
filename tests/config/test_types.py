"""Shared config types: limits that mirror Airflow's own stay equal to them."""

from __future__ import annotations

from airflow.sdk.definitions.dag import TAG_MAX_LEN

from airflow_trainpipe.config.types import DAG_TAG_MAX_LENGTH


def test_the_tag_limit_is_airflows() -> None:
    assert DAG_TAG_MAX_LENGTH == TAG_MAX_LEN
