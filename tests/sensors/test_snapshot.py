"""DataSnapshotSensor in poke, reschedule and deferrable mode, through dag.test(), on file:// and s3://.

The partition is written by the test while the sensor waits, so each run proves both the
"not yet" and the "complete" answer of the real check.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor
from tests.helpers.airflow_dags import DagTestRun, run_dags_of_file

DAY = date(2026, 1, 2)
MODES = ("poke", "reschedule", "deferrable")

DAG_SOURCE = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor

with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    for task_id, data, conn_id in {sensors!r}:
        DataSnapshotSensor(task_id=task_id, data=DataSection.model_validate(data), conn_id=conn_id)
"""


def _data(uri: str, mode: str, **wait: object) -> dict[str, object]:
    return {
        "uri": uri,
        "label": "is_fraud",
        "features": {"numeric": ["amount"]},
        "wait": {"mode": mode, "poke_interval": "1s", "timeout": "90s", **wait},
    }


class _WriterOnFirstMiss:
    """Writes a root's day partition (marker last) once a sensor has logged that it is not complete
    (only the `roots` given: the timeout's root must stay empty)."""

    MISS = re.compile(r"not complete: (\S+)/ds=2026-01-02/_SUCCESS")

    def __init__(self, roots: set[str]) -> None:
        self.roots = roots
        self.threads: dict[str, threading.Thread] = {}

    def __call__(self, line: str) -> None:
        match = self.MISS.search(line)
        if match and match.group(1) in self.roots and match.group(1) not in self.threads:
            thread = threading.Thread(target=write_day, args=(match.group(1), DAY, 500), kwargs={"seed": 2})
            self.threads[match.group(1)] = thread
            thread.start()

    def join(self) -> list[str]:
        for thread in self.threads.values():
            thread.join()
        return sorted(self.threads)


def test_poke_answers_from_the_marker_and_the_row_count(tmp_path: Path) -> None:
    sensor = DataSnapshotSensor(
        task_id="w",
        data=DataSection.model_validate(_data(tmp_path.as_uri(), "poke", min_rows=500)),
        partition="ds=2026-01-02",
    )
    assert (
        sensor.mode == "poke"
        and not sensor.deferrable
        and sensor.poke_interval == 1.0
        and sensor.timeout == 90.0
    )
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


@dataclass
class Waits:
    run: DagTestRun
    roots: dict[str, str]  # task id -> the root it waited on
    written: list[str]  # roots whose partition the writer wrote after a sensor's miss
    timeout: DagTestRun  # the run of wait_timeout: a sensor whose partition never arrives


@pytest.fixture(scope="module")
def waits(airflow_env: dict[str, str], s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Waits:
    """One DAG run, one sensor per mode and storage, each waiting on its own root: a DAG run
    costs a process start and a DAG parse, the sensors are independent. The same process then
    runs wait_timeout, a DAG of its own (its failure must not be this run's), whose sensor
    waits on a root nothing is written to."""
    connection = {
        "conn_type": "aws",
        "login": "testing",
        "password": "testing",
        "extra": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"},
    }
    # The s3 sensors read only the connection: no AWS_* variables reach the DAG run.
    env = {k: v for k, v in airflow_env.items() if not k.startswith("AWS_")}
    env["AIRFLOW_CONN_MOTO_S3"] = json.dumps(connection)
    files = tmp_path_factory.mktemp("wait_file")
    for mode in MODES:
        (files / mode).mkdir()
    roots = {
        **{f"wait_file_{mode}": (files / mode).as_uri() for mode in MODES},
        **{f"wait_s3_{mode}": f"s3://trainpipe/wait_{mode}" for mode in MODES},
    }
    sensors = [
        (task_id, _data(root, task_id.rsplit("_", 1)[1]), "moto_s3" if root.startswith("s3://") else None)
        for task_id, root in roots.items()
    ]
    # Poke mode: dag.test() runs a deferred trigger inline without its timeout (the scheduler
    # enforces that in a deployment), so the sensor's own timeout is what can be shown here.
    never = files / "never"
    never.mkdir()
    data = _data(never.as_uri(), "poke")
    data["wait"]["timeout"] = "3s"  # type: ignore[index]
    writer = _WriterOnFirstMiss(set(roots.values()))
    source = (
        DAG_SOURCE.format(dag_id="wait_for_partitions", sensors=sensors)
        + "\nwait_for_partitions = dag\n"
        + DAG_SOURCE.format(dag_id="wait_timeout", sensors=[("wait_for_data", data, None)])
        + "\nwait_timeout = dag\n"
    )
    runs = [("wait_for_partitions", DAY.isoformat()), ("wait_timeout", DAY.isoformat())]
    waited, timed_out = run_dags_of_file(env, "wait_for_partitions", source, runs, on_line=writer)
    return Waits(waited, roots, writer.join(), timed_out)


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_waits_until_the_partition_is_complete_on_file(waits: Waits, mode: str) -> None:
    task_id = f"wait_file_{mode}"
    root = waits.roots[task_id]
    assert waits.run.tasks[task_id] == "success", waits.run.output[-4000:]
    assert root in waits.written, "the sensor never reported an incomplete partition"
    assert f"complete: {root}/ds=2026-01-02/_SUCCESS exists" in waits.run.output


@pytest.mark.slow
@pytest.mark.parametrize("mode", MODES)
def test_waits_on_s3_with_an_aws_connection(waits: Waits, mode: str) -> None:
    task_id = f"wait_s3_{mode}"
    root = waits.roots[task_id]
    assert waits.run.tasks[task_id] == "success", waits.run.output[-4000:]
    assert root in waits.written
    assert f"not complete: {root}/ds=2026-01-02/_SUCCESS does not exist yet" in waits.run.output


@pytest.mark.slow
def test_the_dag_run_succeeds_once_every_partition_arrived(waits: Waits) -> None:
    assert waits.run.state == "success" and set(waits.run.tasks.values()) == {"success"}, waits.run.output[
        -4000:
    ]
    assert sorted(waits.run.tasks) == sorted(waits.roots)
    # A deferrable sensor's trigger runs inline in dag.test(); poke and reschedule never defer.
    assert waits.run.output.count("running trigger in line") == 2, waits.run.output[-4000:]


@pytest.mark.slow
def test_times_out_when_nothing_arrives(waits: Waits) -> None:
    # Run in the `waits` fixture's process (one interpreter start and parse fewer, ~8 s): a DAG
    # of its own, on a root no writer touches, so it proves the same as its own process did.
    run = waits.timeout
    assert run.state == "failed" and run.tasks == {"wait_for_data": "failed"}, run.output[-4000:]
    assert "AirflowSensorTimeout" in run.output
    assert "not complete: " in run.output and "AirflowSensorTimeout" not in waits.run.output


@pytest.mark.parametrize("flag", ["soft_fail", "silent_fail"])
@pytest.mark.parametrize("mode", ["poke", "reschedule"])
def test_a_partition_outside_the_data_uri_fails_at_once_whatever_the_sensor_flags(
    tmp_path: Path, flag: str, mode: str
) -> None:
    from airflow_trainpipe.data.snapshots.errors import PartitionError

    sensor = DataSnapshotSensor(
        task_id="wait_for_data",
        data=DataSection.model_validate(_data(tmp_path.as_uri(), mode)),
        partition="../other_pipeline/ds=2026-01-02",  # what a form or a run's conf can send
        **{flag: True},
    )
    # Not a failed poke that silent_fail would retry until the timeout, nor one soft_fail would
    # turn into a skip: the run's own input is wrong, and no retry mends it.
    with pytest.raises(PartitionError, match=re.escape("'../other_pipeline/ds=2026-01-02'")) as caught:
        sensor.execute({})  # type: ignore[arg-type]
    assert caught.value.retryable is False


def test_a_sql_source_waits_until_its_window_query_returns_min_rows(
    postgres_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime

    from airflow_trainpipe.config.templates import date_context
    from tests.helpers import warehouse

    url = warehouse.create_database(postgres_server.url, "sensor_tests")
    warehouse.load_days(url, [date(2026, 1, 1)], 600)  # in the run's window, but not its own day
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", url)
    data = {
        **_data(tmp_path.as_uri(), "poke", min_rows=500),
        "source": {
            "kind": "sql",
            "conn_id": "warehouse",
            "query": warehouse.WINDOW_QUERY,
            "order_by": ["transaction_id"],
        },
        "window": {"partitions": 3},
    }
    sensor = DataSnapshotSensor(task_id="w", data=DataSection.model_validate(data), partition="ds=2026-01-02")
    context = date_context(datetime(2026, 1, 2, tzinfo=UTC))
    assert sensor.poke(context) is False  # type: ignore[arg-type]
    warehouse.load_days(url, [DAY], 499)
    assert sensor.poke(context) is False  # type: ignore[arg-type]
    warehouse.load_days(url, [DAY], 1, seed=9)
    assert sensor.poke(context) is True  # type: ignore[arg-type]
    trigger = sensor._trigger(context)  # type: ignore[arg-type]
    assert type(trigger).__name__ == "SourceRowsTrigger" and trigger.kind == "sql"
    assert (
        "event_time >= '2026-01-02T00:00:00+00:00' AND event_time < '2026-01-03T00:00:00+00:00'"
        in trigger.wait["query"]
    )


def test_a_delta_source_waits_until_its_window_holds_min_rows_at_the_current_version(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from airflow_trainpipe.config.templates import date_context
    from tests.helpers import lake

    table = tmp_path / "lake" / "transactions"
    lake.write_days(table, [date(2026, 1, 1)], 600)  # in the run's window, but not its own day
    data = {
        **_data(tmp_path.as_uri(), "poke", min_rows=500),
        "source": {
            "kind": "delta",
            "uri": table.as_uri(),
            "time_column": "event_time",
            "order_by": ["transaction_id"],
        },
        "window": {"partitions": 3},
    }
    sensor = DataSnapshotSensor(task_id="w", data=DataSection.model_validate(data), partition="ds=2026-01-02")
    context = date_context(datetime(2026, 1, 2, tzinfo=UTC))
    assert sensor.poke(context) is False  # type: ignore[arg-type]
    lake.write_days(table, [DAY], 499)
    assert sensor.poke(context) is False  # type: ignore[arg-type]
    lake.write_days(table, [DAY], 1, seed=9)
    ready, reason = sensor._ready(context)  # type: ignore[arg-type]
    assert ready and reason.startswith(
        f"{table.as_uri()} (version 2) holds 500 row(s) in ((event_time >= 2026-01-02"
    )
    trigger = sensor._trigger(context)  # type: ignore[arg-type]
    assert type(trigger).__name__ == "SourceRowsTrigger" and trigger.kind == "delta"
    assert (trigger.wait["window_start"], trigger.wait["window_end"]) == (
        "2026-01-02T00:00:00+00:00",
        "2026-01-03T00:00:00+00:00",
    )


def test_an_iceberg_source_waits_until_its_window_holds_min_rows_at_the_current_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from datetime import UTC, datetime

    from airflow_trainpipe.config.templates import date_context
    from tests.helpers import iceberg_lake

    table = iceberg_lake.table(tmp_path, monkeypatch)
    iceberg_lake.write_days(table, [date(2026, 1, 1)], 600)  # in the run's window, but not its own day
    data = {
        **_data(tmp_path.as_uri(), "poke", min_rows=500),
        "source": {
            "kind": "iceberg",
            "conn_id": iceberg_lake.CONN_ID,
            "table": iceberg_lake.TABLE,
            "time_column": "event_time",
            "order_by": ["transaction_id"],
        },
        "window": {"partitions": 3},
    }
    sensor = DataSnapshotSensor(task_id="w", data=DataSection.model_validate(data), partition="ds=2026-01-02")
    context = date_context(datetime(2026, 1, 2, tzinfo=UTC))
    assert sensor.poke(context) is False  # type: ignore[arg-type]
    iceberg_lake.write_days(table, [DAY], 499)
    assert sensor.poke(context) is False  # type: ignore[arg-type]
    iceberg_lake.write_days(table, [DAY], 500, seed=9)  # the day written again, with 500 rows
    ready, reason = sensor._ready(context)  # type: ignore[arg-type]
    snapshot = table.refresh().current_snapshot().snapshot_id
    assert ready and reason == (
        f"Iceberg table sales.card_transactions (snapshot {snapshot}, catalog lake) holds 500 row(s) in "
        "event_time >= '2026-01-02T00:00:00+00:00' AND event_time < '2026-01-03T00:00:00+00:00'"
    )
    trigger = sensor._trigger(context)  # type: ignore[arg-type]
    assert type(trigger).__name__ == "SourceRowsTrigger" and trigger.kind == "iceberg"
    assert (trigger.wait["window_start"], trigger.wait["window_end"], trigger.wait["min_rows"]) == (
        "2026-01-02T00:00:00+00:00",
        "2026-01-03T00:00:00+00:00",
        500,
    )
