"""SqlRowsTrigger against a real PostgreSQL: fires on enough rows, keeps waiting while the database
is unreachable, ends the wait at once on a query the database refuses."""

from __future__ import annotations

from datetime import date

import pytest

from airflow_trainpipe.triggers.sql import SqlRowsTrigger
from tests.helpers import warehouse
from tests.helpers.triggers import first_event


def test_fires_once_the_query_returns_enough_rows(postgres_server, monkeypatch: pytest.MonkeyPatch) -> None:
    url = warehouse.create_database(postgres_server.url, "trigger_tests")
    warehouse.load_days(url, [date(2026, 1, 2)], 20)
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", url)
    query = "SELECT * FROM card_transactions"
    trigger = SqlRowsTrigger(conn_id="warehouse", query=query, min_rows=20, poke_interval=0.1)
    assert first_event(trigger, 20) == {
        "status": "ready",
        "message": "the query on 'warehouse' returns 20 row(s)",
    }
    waiting = SqlRowsTrigger(conn_id="warehouse", query=query, min_rows=21, poke_interval=0.1)
    assert first_event(waiting, 1.0) is None
    refused = SqlRowsTrigger(conn_id="warehouse", query="SELECT * FROM nope", min_rows=1, poke_interval=0.1)
    event = first_event(refused, 20)
    assert (
        event is not None
        and event["status"] == "error"
        and 'relation "nope" does not exist' in event["message"]
    )
    kind, kwargs = refused.serialize()
    assert (
        kind == "airflow_trainpipe.triggers.sql.SqlRowsTrigger"
        and SqlRowsTrigger(**kwargs).query == "SELECT * FROM nope"
    )


def test_an_unreachable_database_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.conftest import free_port

    monkeypatch.setenv("AIRFLOW_CONN_DOWN", f"postgres://postgres@127.0.0.1:{free_port()}/postgres")
    trigger = SqlRowsTrigger(conn_id="down", query="SELECT 1", min_rows=1, poke_interval=0.1)
    assert first_event(trigger, 1.5) is None  # no error event: it keeps waiting
