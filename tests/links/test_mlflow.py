"""The MLflow extra links through Airflow's own task runner (`dag.test()`): after each task the
runner calls `get_link` and stores the result under the link's `xcom_key`, which the UI reads.
A task that knew no MLflow UI URL (the embedded sqlite store), or failed before it knew one,
gets no link and no error in its log."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from tests.helpers.airflow_dags import run_dag_file

URL = "http://127.0.0.1:5000/#/experiments/1/runs/abc"

DAG_FILE = f"""
from datetime import datetime

from airflow.sdk import DAG, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.links.mlflow import MlflowModelVersionLink, MlflowRunLink


class Linked(BaseOperator):
    operator_extra_links = (MlflowRunLink(), MlflowModelVersionLink())

    def __init__(self, *, url, fail=False, **kwargs):
        super().__init__(**kwargs)
        self.url, self.fail = url, fail

    def execute(self, context):
        if self.fail:
            raise AirflowFailException("failed before it knew a URL")
        MlflowRunLink.persist(context, self.url)
        MlflowModelVersionLink.persist(context, self.url and self.url + "/version")


with DAG("links", schedule=None, start_date=datetime(2026, 1, 1)) as dag:
    Linked(task_id="with_ui", url={URL!r})
    Linked(task_id="without_ui", url=None)
    Linked(task_id="failed", url={URL!r}, fail=True)
"""


def _links(airflow_home: Path) -> dict[tuple[str, str], object]:
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        rows = db.execute("select task_id, key, value from xcom where dag_id = 'links'").fetchall()
    return {(task_id, key): json.loads(value) for task_id, key, value in rows}


def test_links_are_resolved_by_the_task_runner_without_errors(airflow_env: dict[str, str]) -> None:
    run = run_dag_file(airflow_env, "links", DAG_FILE)
    assert run.tasks == {"with_ui": "success", "without_ui": "success", "failed": "failed"}, run.output[
        -4000:
    ]
    links = _links(Path(airflow_env["AIRFLOW_HOME"]))
    assert links[("with_ui", "_link_MlflowRunLink")] == URL
    assert links[("with_ui", "_link_MlflowModelVersionLink")] == URL + "/version"
    for task_id in ("without_ui", "failed"):
        assert (
            links[(task_id, "_link_MlflowRunLink")] == ""
            and links[(task_id, "_link_MlflowModelVersionLink")] == ""
        )
    assert "XCom not found" not in run.output, run.output[-4000:]
    assert "Failed to push an xcom for task operator extra link" not in run.output
