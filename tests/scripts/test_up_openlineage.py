"""`make up` writes every task's OpenLineage events to a file under TRAINPIPE_HOME, unless the
user configured a transport of their own."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.conftest import load_up


def test_make_up_appends_the_events_to_a_file_under_trainpipe_home(tmp_path: Path) -> None:
    env = load_up().airflow_env(
        tmp_path / "airflow", tmp_path / "dags", tmp_path, tmp_path / "home", 8080, "{}"
    )
    transport = json.loads(env["AIRFLOW__OPENLINEAGE__TRANSPORT"])
    assert transport == {
        "type": "file",
        "log_file_path": str(tmp_path / "home" / "openlineage" / "events.jsonl"),
        "append": True,
    }
    assert (tmp_path / "home" / "openlineage").is_dir() and env[
        "AIRFLOW__OPENLINEAGE__NAMESPACE"
    ] == "trainpipe"


def test_a_transport_of_the_users_is_left_alone(tmp_path: Path) -> None:
    up = load_up()
    assert up.openlineage_env({"OPENLINEAGE_URL": "http://marquez:5000"}, tmp_path) == {}
    assert not (tmp_path / "openlineage").exists()
