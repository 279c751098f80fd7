"""DataSnapshotSensor in poke, reschedule and deferrable mode, through dag.test(), on file:// and s3://.

The partition is written by the test while the sensor waits, so each run proves both the
"not yet" and the "complete" answer of the real check.
"""

from __future__ import annotations

import json
import threading
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor
from airflow_trainpipe.synthetic import write_day
from tests.airflow_dags import run_dag_file

DAY = date(2026, 1, 2)
MODES = ("poke", "reschedule", "deferrable")

DAG_SOURCE = '''
from datetime import datetime

from airflow.sdk import DAG

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor

data = DataSection.model_validate({data!r})
with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    DataSnapshotSensor(task_id="wait_for_data", data=data, conn_id={conn_id!r})
'''


def _data(uri: str, mode: str, **wait: object) -> dict[str, object]:
    return {"uri": uri, "label": "is_fraud", "features": {"numeric": ["amount"]},
            "wait": {"mode": mode, "poke_interval": "1s", "timeout": "90s", **wait}}


class _WriterOnFirstMiss:
    """Writes the day's partition (marker last) once the sensor has logged that it is not complete."""

    def __init__(self, root_uri: str) -> None:
        self.root_uri = root_uri
        self.thread: threading.Thread | None = None

    def __call__(self, line: str) -> None:
        if self.thread is None and "not complete:" in line:
            self.thread = threading.Thread(target=write_day, args=(self.root_uri, DAY, 500), kwargs={"seed": 2})
            self.thread.start()

    def join(self) -> None:
        assert self.thread is not None, "the sensor never reported an incomplete partition"
        self.thread.join()


def test_poke_answers_from_the_marker_and_the_row_count(tmp_path: Path) -> None:
    sensor = DataSnapshotSensor(task_id="w", data=DataSection.model_validate(_data(tmp_path.as_uri(), "poke", min_rows=500)),
                                partition="ds=2026-01-02")
    assert sensor.mode == "poke" and not sensor.deferrable and sensor.poke_interval == 1.0 and sensor.timeout == 90.0
    assert sensor.poke({}) is False
    write_day(tmp_path.as_uri(), DAY, 499, seed=2)
    assert sensor.poke({}) is False  # marker there, one row short
    write_day(tmp_path.as_uri(), DAY, 500, seed=2)
    assert sensor.poke({}) is True


def test_mode_comes_from_the_config() -> None:
    make = lambda mode: DataSnapshotSensor(task_id="w", data=DataSection.model_validate(_data("data", mode)))  # noqa: E731
    assert (make("reschedule").mode, make("reschedule").deferrable) == ("reschedule", False)
    assert (make("deferrable").mode, make("deferrable").deferrable) == ("poke", True)
    assert DataSnapshotSensor.template_fields == ("partition", "conn_id")


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_waits_until_the_partition_is_complete_on_file(airflow_env: dict[str, str], tmp_path: Path, mode: str) -> None:
    root = tmp_path.as_uri()
    source = DAG_SOURCE.format(dag_id=f"wait_file_{mode}", data=_data(root, mode), conn_id=None)
    writer = _WriterOnFirstMiss(root)
    run = run_dag_file(airflow_env, f"wait_file_{mode}", source, on_line=writer)
    writer.join()
    assert run.state == "success" and run.tasks == {"wait_for_data": "success"}, run.output[-4000:]
    assert f"complete: {root}/ds=2026-01-02/_SUCCESS exists" in run.output
    if mode == "deferrable":
        assert "running trigger in line" in run.output


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_waits_on_s3_with_an_aws_connection(airflow_env: dict[str, str], s3_endpoint: str, mode: str) -> None:
    connection = {"conn_type": "aws", "login": "testing", "password": "testing",
                  "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    # The task reads only the connection: no AWS_* variables reach the DAG run.
    env = {k: v for k, v in airflow_env.items() if not k.startswith("AWS_")}
    env["AIRFLOW_CONN_MOTO_S3"] = json.dumps(connection)
    root = f"s3://trainpipe/wait_{mode}"
    source = DAG_SOURCE.format(dag_id=f"wait_s3_{mode}", data=_data(root, mode), conn_id="moto_s3")
    writer = _WriterOnFirstMiss(root)
    run = run_dag_file(env, f"wait_s3_{mode}", source, on_line=writer)
    writer.join()
    assert run.state == "success" and run.tasks == {"wait_for_data": "success"}, run.output[-4000:]
    assert f"not complete: {root}/ds=2026-01-02/_SUCCESS does not exist yet" in run.output


@pytest.mark.slow
def test_times_out_when_nothing_arrives(airflow_env: dict[str, str], tmp_path: Path) -> None:
    # Poke mode: dag.test() runs a deferred trigger inline without its timeout (the scheduler
    # enforces that in a deployment), so the sensor's own timeout is what can be shown here.
    data = _data(tmp_path.as_uri(), "poke")
    data["wait"]["timeout"] = "3s"  # type: ignore[index]
    run = run_dag_file(airflow_env, "wait_timeout", DAG_SOURCE.format(dag_id="wait_timeout", data=data, conn_id=None))
    assert run.state == "failed" and run.tasks == {"wait_for_data": "failed"}
    assert "AirflowSensorTimeout" in run.output
