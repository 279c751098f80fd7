"""DataValidateOperator in dag.test(): a clean day hands the snapshot's exact files downstream; a
drifted day fails at once (no retry), with the report written and nothing downstream run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.examples.synthetic import Problem, write_day
from airflow_trainpipe.operators.validate import DataValidateOperator
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import DagTestRun, run_dags_of_file
from tests.helpers.smtp_server import SmtpServer

DAG_SOURCE = """
from datetime import datetime

from airflow.sdk import DAG, task

from airflow_trainpipe.config import load_config
from airflow_trainpipe.notifications.email import PipelineEmailNotifier
from airflow_trainpipe.operators.validate import DataValidateOperator


@task
def train(validation):
    # What DistributedTrainOperator receives in the pipeline: the summary with the manifest.
    from airflow_trainpipe.core.digest import content_digest
    from airflow_trainpipe.contracts.payloads import ValidationSummary

    summary = ValidationSummary.model_validate(validation)
    data_files = summary.manifest.file_uris
    assert content_digest(data_files) == summary.digest
    print("TRAINS-ON " + " ".join(data_files) + " " + summary.digest)


with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    validate = DataValidateOperator(task_id="validate_data", config={config!r}, retries=2{callbacks})
    train(validate.output)
"""

# The failure callback the DAG factory gives every task of a config with `notify`.
NOTIFY_CALLBACK = """,
        on_failure_callback=[PipelineEmailNotifier.for_event(load_config({config!r}).notify, "fraud_detector", "failure")]"""


def test_template_fields_are_the_public_api() -> None:
    assert DataValidateOperator.template_fields == ("partition", "conn_id")
    operator = DataValidateOperator(task_id="v", config=str(EXAMPLE_CONFIGS / "fraud_detector.yaml"))
    assert operator.partition == "ds={{ ds }}"


@pytest.mark.slow
def test_clean_day_trains_on_the_snapshot_and_drifted_day_stops_before_training(runs: ValidateRuns) -> None:
    """...and the drifted day's failure e-mails the config's `notify` recipients (a real SMTP
    server on 127.0.0.1), once: as a failed validation, not also as a failed task."""
    clean, drifted, data, smtp_server = runs.clean, runs.drifted, runs.clean_data, runs.smtp
    assert (clean.state, clean.tasks) == ("success", {"validate_data": "success", "train": "success"}), (
        clean.output[-5000:]
    )
    snapshots = [json.loads(path.read_text()) for path in (data / "_trainpipe" / "snapshots").glob("*.json")]
    (snapshot,) = [s for s in snapshots if all("/ds=2026-01-01/" in f["uri"] for f in s["files"])]
    files = " ".join(f["uri"] for f in snapshot["files"])
    assert f"TRAINS-ON {files} {snapshot['digest']}" in clean.output
    assert (
        f"snapshot {snapshot['digest']}" in clean.output and "all 8 check(s) passed" in clean.output
    )  # schema, 2 volume, 5 expectations

    assert drifted.state == "failed", drifted.output[-5000:]
    assert drifted.tasks == {"validate_data": "failed", "train": "upstream_failed"}
    assert drifted.tries["validate_data"] == 1  # retries=2, yet bad data is not retried
    assert "failed validation (drift: amount)" in drifted.output
    report = json.loads(
        next((data / "ds=2026-01-02" / "_trainpipe" / "fraud_detector").glob("*/report.json")).read_text()
    )
    assert report["passed"] is False and report["reference"]["partition"] == "ds=2026-01-01"
    assert [c["column"] for c in report["checks"] if not c["passed"]] == ["amount"]
    assert "TRAINS-ON" not in drifted.output
    mail = smtp_server.inbox.wait_for("fraud_detector: data validation failed", timeout=30)
    assert mail.recipients == ["ml-oncall@example.com"]
    assert "drift: amount" in mail.html and "Nothing was trained" in mail.html
    assert len(smtp_server.inbox.received) == 1


ESCAPING_PARTITION_DAG = """
from datetime import datetime

from airflow.sdk import DAG

from airflow_trainpipe.config import load_config
from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.validate import DataValidateOperator
from airflow_trainpipe.sensors.snapshot import DataSnapshotSensor

config = load_config({config!r})
# The trigger form's partition reaches the tasks through a template, as in the factory's DAGs.
with DAG("escaping_partition", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         params={{"partition": "../outside/ds=2026-01-01"}}) as dag:
    partition = "{{{{ params.partition }}}}"
    DataSnapshotSensor(task_id="wait_for_data", data=config.data, partition=partition, mode="poke",
                       poke_interval=1, timeout=30, retries=2)
    DataValidateOperator(task_id="validate_data", config=config, partition=partition, retries=2)
    DistributedTrainOperator(task_id="train", config=config, partition=partition, retries=2)
"""


@pytest.mark.slow
def test_a_partition_that_leaves_data_uri_fails_every_task_at_once(runs: ValidateRuns) -> None:
    run, tmp_path = runs.escaping, runs.escaping_root
    assert run.tasks == dict.fromkeys(("wait_for_data", "validate_data", "train"), "failed"), run.output[
        -5000:
    ]
    assert run.tries == dict.fromkeys(
        ("wait_for_data", "validate_data", "train"), 1
    )  # retries=2: not retried
    assert run.output.count("partition '../outside/ds=2026-01-01' (under data.uri") >= 3
    assert not (tmp_path / "outside" / "_trainpipe").exists()
    assert not (tmp_path / "outside" / "ds=2026-01-01" / "_trainpipe").exists()


WINDOW_DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_trainpipe.operators.train import DistributedTrainOperator
from airflow_trainpipe.operators.validate import DataValidateOperator


@task
def lineage(result):
    from airflow_trainpipe.hooks.mlflow import MlflowHook

    tags = MlflowHook().get_conn().get_run(result["mlflow_run_id"]).data.tags
    print("LINEAGE " + " | ".join(f"{{k}}={{v}}" for k, v in sorted(tags.items()) if k.startswith("trainpipe.data")))


with DAG({dag_id!r}, schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    validate = DataValidateOperator(task_id="validate_data", config={config!r})
    # The one-rank job is forked from the worker's warm parent (TRAINPIPE_FORK_LOCAL_JOBS, set by
    # dag_test_env): the runs of one call share it. The subject here is the window's snapshot and
    # its lineage tags, which the job reads and logs the same either way.
    train = DistributedTrainOperator(task_id="train", config={config!r}, validation=validate.output,
                                     max_steps=3, nproc=1, retries=0)
    lineage(train.output)
"""


def _window_config(tmp_path: Path, data: Path, minimum: int) -> Path:
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    for old, new in (
        ("uri: data/card_transactions", f"uri: {data.as_uri()}"),
        ("uri: checkpoints", f"uri: {(tmp_path / 'ckpt').as_uri()}"),
        ("min_rows: 1000", "min_rows: 100"),
        (
            "  format: parquet\n",
            f"  format: parquet\n  window: {{partitions: 30, min_partitions: {minimum}}}\n",
        ),
    ):
        text = text.replace(old, new)
    path = tmp_path / f"window_{minimum}.yaml"
    path.write_text(text)
    return path


@pytest.mark.slow
def test_a_30_partition_window_trains_on_one_snapshot_and_validates_each_partition_once(
    runs: ValidateRuns,
) -> None:
    first, second, rewritten, short = runs.window
    data = runs.window_data
    for run in (first, second):
        assert (run.state, set(run.tasks.values())) == ("success", {"success"}), run.output[-6000:]
        # dag_test_env's TRAINPIPE_FORK_LOCAL_JOBS reached the train task.
        assert "forking torchrun's agent from the warm parent with 1 process(es)" in run.output
    # The first run validates the 28 earlier partitions it has no record of, oldest first, then its own.
    assert (
        "window: 28 earlier partition(s), 0 reused their validation records, 28 validated now" in first.output
    )
    assert "window ds=2026-01-01 .. ds=2026-01-30: snapshot sha256:" in first.output
    assert "of 29 partition(s) (1 missing: ds=2026-01-15), 29 file(s), 17400 rows" in first.output
    # The next day validates only its own partition: the other 28 reuse their records.
    assert (
        "window: 28 earlier partition(s), 28 reused their validation records, 0 validated now"
        in second.output
    )
    assert second.output.count("has no current validation record") == 0
    (lineage,) = [line for line in second.output.splitlines() if "LINEAGE " in line]
    digest = next(s for s in _snapshots(data) if s["window"] and s["window"][0] == "ds=2026-01-02")["digest"]
    assert lineage.split("LINEAGE ", 1)[1] == (
        f"trainpipe.data_digest={digest} | trainpipe.data_missing=ds=2026-01-15 | "
        "trainpipe.data_partitions=29 | trainpipe.data_window=ds=2026-01-02 .. ds=2026-01-31"
    )
    assert "snapshot " + digest + ": 29 file(s), 17400 rows" in second.output  # what train read

    # An earlier partition rewritten since its record (a backfill upstream) is validated again.
    assert (rewritten.state, set(rewritten.tasks.values())) == ("success", {"success"}), rewritten.output[
        -6000:
    ]
    assert (
        "window: 28 earlier partition(s), 27 reused their validation records, 1 validated now"
        in rewritten.output
    )
    assert "window partition ds=2026-01-10 has no current validation record" in rewritten.output
    assert "of 29 partition(s) (1 missing: ds=2026-01-15), 29 file(s), 17450 rows" in rewritten.output

    # One more partition lost: below the minimum, the run stops before training, naming both.
    assert short.tasks == {
        "validate_data": "failed",
        "train": "upstream_failed",
        "lineage": "upstream_failed",
    }
    assert short.tries["validate_data"] == 1, short.output[-6000:]
    assert (
        "the window of 30 partitions ending at ds=2026-02-02 under "
        f"{data.as_uri()} has 28, fewer than data.window.min_partitions (29); "
        "missing: ds=2026-01-15, ds=2026-01-20"
    ) in short.output


@dataclass
class ValidateRuns:
    clean: DagTestRun
    drifted: DagTestRun
    clean_data: Path
    smtp: SmtpServer
    escaping: DagTestRun
    escaping_root: Path
    window: list[DagTestRun]
    window_data: Path


@pytest.fixture(scope="module")
def runs(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ValidateRuns]:
    """The three DAGs of this module's tests, run in one process, one DAG run after the other (a
    process of its own costs each an interpreter start, an Airflow import and the execution API's
    start, ~8 s): validate_then_train on a clean then a drifted day, escaping_partition, then the
    window over four days, the data changed between its runs. Their data, configs and reports
    are each their own (no DAG reads another's), and each run's output is its own."""
    root = tmp_path_factory.mktemp("validate_dags")

    # validate_then_train: a clean day, then a drifted one.
    clean_data = root / "clean" / "data"
    write_day(clean_data.as_uri(), date(2026, 1, 1), 3000, seed=1)
    write_day(clean_data.as_uri(), date(2026, 1, 2), 3000, seed=1, problems=[Problem.parse("drift:amount")])
    text = (
        (
            (EXAMPLE_CONFIGS / "fraud_detector.yaml")
            .read_text()
            .replace("uri: data/card_transactions", f"uri: {clean_data.as_uri()}")
        )
        + "\nnotify:\n  email: [ml-oncall@example.com]\n  smtp_conn_id: smtp_test\n  from_email: trainpipe@example.com\n"
    )
    clean_config = root / "clean" / "fraud_detector.yaml"
    clean_config.write_text(text)
    callbacks = NOTIFY_CALLBACK.format(config=str(clean_config))
    source = DAG_SOURCE.format(dag_id="validate_then_train", config=str(clean_config), callbacks=callbacks)
    source += "\nvalidate_then_train = dag\n"

    # escaping_partition: a real partition outside data.uri (before the check, the tasks read it
    # and wrote reports there).
    escaping_root = root / "escaping"
    write_day((escaping_root / "outside").as_uri(), date(2026, 1, 1), 1500, seed=1)
    text = (
        (EXAMPLE_CONFIGS / "fraud_detector.yaml")
        .read_text()
        .replace("uri: data/card_transactions", f"uri: {(escaping_root / 'data').as_uri()}")
    )
    escaping_config = escaping_root / "fraud_detector.yaml"
    escaping_config.write_text(text)
    source += ESCAPING_PARTITION_DAG.format(config=str(escaping_config)) + "\nescaping_partition = dag\n"

    # windowed: 30 daily partitions, the 15th never arrived.
    window_root = root / "window"
    window_data = window_root / "data"
    for day in [date(2026, 1, d) for d in range(1, 32) if d != 15]:
        write_day(window_data.as_uri(), day, 600, seed=4)
    window_config = _window_config(window_root, window_data, minimum=29)
    source += WINDOW_DAG.format(dag_id="windowed", config=str(window_config)) + "\nwindowed = dag\n"
    window_days = ["2026-01-30", "2026-01-31", "2026-02-01", "2026-02-02"]
    order = [
        ("validate_then_train", "2026-01-01"),
        ("validate_then_train", "2026-01-02"),
        ("escaping_partition", "2026-01-01"),
        *(("windowed", day) for day in window_days),
    ]

    def change_the_data(index: int) -> None:
        dag_var, logical_date = order[index]
        if dag_var != "windowed":
            return
        if logical_date == "2026-02-01":
            # An earlier partition rewritten since its record (a backfill upstream).
            write_day(window_data.as_uri(), date(2026, 1, 10), 650, seed=5)
            write_day(window_data.as_uri(), date(2026, 2, 1), 600, seed=4)
        elif logical_date == "2026-02-02":
            # One more partition lost.
            write_day(window_data.as_uri(), date(2026, 2, 2), 600, seed=4)
            for path in (window_data / "ds=2026-01-20").glob("*.parquet"):
                path.unlink()

    with SmtpServer() as smtp:
        env = {**airflow_env, "AIRFLOW_CONN_SMTP_TEST": smtp.connection_json()}
        done = run_dags_of_file(env, "validate_dags", source, order, 900, before_run=change_the_data)
        clean, drifted, escaping, *window = done
        yield ValidateRuns(clean, drifted, clean_data, smtp, escaping, escaping_root, window, window_data)


def _snapshots(data: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in (data / "_trainpipe" / "snapshots").glob("*.json")]
