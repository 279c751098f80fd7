"""train -> gate -> register through Airflow's own dag.test(), against a real `mlflow server` with
basic auth (the embedded sqlite store runs the same tasks in test_demo.py).

One subprocess runs several DAG runs in a row (each dag.test() is a real DAG run in a real
Airflow metadata DB); the test then reads task states, XComs and the MLflow registry.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import uuid
from datetime import date
from pathlib import Path

import pytest

from tests.helpers.airflow_dags import dag_test_env
from tests.helpers.mlflow_backends import write_config
from tests.helpers.mlflow_server import log_candidate_run

DAG_FILE = '''
from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timedelta

from airflow.sdk import DAG, task

from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.operators.gate import BaselineGateOperator
from airflow_trainpipe.operators.register import RegisterModelOperator
from airflow_trainpipe.operators.train import DistributedTrainOperator


class RegisterCrashingOnce(RegisterModelOperator):
    """With conf crash_register: try 1 registers the version, then dies before returning."""

    def execute(self, context):
        result = super().execute(context)
        if context["dag_run"].conf.get("crash_register") and context["ti"].try_number == 1:
            raise RuntimeError("simulated crash after registering")
        return result


def pipeline(dag_id, config, files):
    """train -> gate -> register; without files, gate -> register on conf's mlflow_run_id."""
    with DAG(dag_id, schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
             render_template_as_native_obj=True) as dag:
        run_id = None if files else "{{ dag_run.conf['mlflow_run_id'] }}"
        gate = BaselineGateOperator(task_id="gate", config=config, mlflow_run_id=run_id,
                                    force="{{ dag_run.conf.get('force', False) }}")
        register = RegisterCrashingOnce(task_id="register", config=config, retries=1, retry_delay=timedelta(seconds=0))
        if files:
            DistributedTrainOperator(
                task_id="train", config=config, data_files=files, nproc=1,
                hyperparameter_overrides="{{ dag_run.conf.get('overrides', {}) }}",
            ) >> gate
        gate >> register

        @task
        def log_connection_environment():
            """What a careless DAG author might log: the masker must hide the secret."""
            logging.getLogger("airflow.task").info("environment %s", MlflowHook().environment())

        log_connection_environment()
    return dag


DAGS = {"pipeline_train": pipeline("pipeline_train", __TRAIN_CONFIG__, __FILES__),
        "pipeline_gate": pipeline("pipeline_gate", __GATE_CONFIG__, None)}

if __name__ == "__main__":
    # dag.test() runs tasks in this process and prints their logs with airflow-core's console
    # logging; a worker's supervisor writes task logs through the task SDK's processors, which
    # redact registered secrets. Use those, so the output shows what a task log would.
    from airflow.sdk.log import configure_logging

    configure_logging(output=sys.stdout, colored_console_log=False)
    for dag_id, conf in json.loads(sys.argv[1]):
        run = DAGS[dag_id].test(run_conf=conf)
        print("TEST-RUN " + json.dumps({"run_id": run.run_id, "state": str(run.state)}), flush=True)
'''


class Pipeline:
    """A dags folder, an Airflow home and a TRAINPIPE_HOME in tmp_path; runs DAGs with confs."""

    def __init__(
        self,
        tmp_path: Path,
        migrated_db: Path,
        train_config: Path,
        gate_config: Path,
        files: list[str],
        connection: str | None,
    ):
        self.env = dag_test_env(tmp_path, migrated_db)
        text = (
            DAG_FILE.replace("__TRAIN_CONFIG__", repr(str(train_config)))
            .replace("__GATE_CONFIG__", repr(str(gate_config)))
            .replace("__FILES__", repr(files))
        )
        self.dag_file = Path(self.env["AIRFLOW__CORE__DAGS_FOLDER"]) / "pipelines.py"
        self.dag_file.write_text(text)
        self.airflow_home = Path(self.env["AIRFLOW_HOME"])
        for name in (
            "AIRFLOW_CONN_MLFLOW_DEFAULT",
            "MLFLOW_TRACKING_URI",
            "MLFLOW_TRACKING_USERNAME",
            "MLFLOW_TRACKING_PASSWORD",
        ):
            self.env.pop(name, None)
        if connection:
            self.env["AIRFLOW_CONN_MLFLOW_DEFAULT"] = connection
        self.output = ""

    def run(self, *runs: tuple[str, dict]) -> list[str]:
        done = subprocess.run(
            [sys.executable, str(self.dag_file), json.dumps(list(runs))],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.output += done.stdout + done.stderr
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        results = [
            json.loads(line.split("TEST-RUN ", 1)[1])
            for line in done.stdout.splitlines()
            if "TEST-RUN " in line
        ]
        assert [r["state"] for r in results] == ["success"] * len(runs), self.output[-6000:]
        return [r["run_id"] for r in results]

    def _query(self, sql: str, *args: object) -> list[tuple]:
        with sqlite3.connect(self.airflow_home / "airflow.db") as db:
            return db.execute(sql, args).fetchall()

    def tasks(self, run_id: str) -> dict[str, tuple[str, int]]:
        rows = self._query("select task_id, state, try_number from task_instance where run_id = ?", run_id)
        return {task_id: (state, tries) for task_id, state, tries in rows}

    def xcom(self, run_id: str, task_id: str, key: str = "return_value"):
        rows = self._query(
            "select value from xcom where run_id = ? and task_id = ? and key = ?", run_id, task_id, key
        )
        return json.loads(rows[0][0]) if rows else None


def _registry(backend: str, request: pytest.FixtureRequest, tmp_path: Path):
    """(connection JSON or None for the embedded default, environment for this process's client)."""
    if backend == "server":
        server = request.getfixturevalue("mlflow_server")
        return server.connection_json(), server.client_env()
    return None, {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"}


def _client(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]):
    from mlflow import MlflowClient
    from mlflow.tracking._tracking_service import utils

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(utils, "_tracking_uri", env["MLFLOW_TRACKING_URI"])  # restored after the test
    return MlflowClient()


def _aliases(client, name: str) -> dict[str, str]:
    return {alias: str(version) for alias, version in client.get_registered_model(name).aliases.items()}


@pytest.mark.slow
# The server only: the same six runs on the embedded store took another 80 s of `make test`, and the
# embedded store already runs these tasks end to end in test_demo.py (make demo), while the hook and
# operator tests (registration, gate, links) run on both stores.
@pytest.mark.parametrize("backend", ["server"])
def test_pipeline_through_dag_test(
    backend: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    migrated_airflow_db: Path,
) -> None:
    """Trained candidates: bootstrap, better (register crashes once), worse. Logged runs standing in
    for training (another registered model): a guardrail breach and a forced promotion."""
    from airflow_trainpipe.examples.synthetic import write_day

    connection, client_env = _registry(backend, request, tmp_path)
    (tmp_path / "home").mkdir()
    client = _client(monkeypatch, client_env)
    name, guarded = f"e2e_{backend}_{uuid.uuid4().hex[:6]}", f"guard_{backend}_{uuid.uuid4().hex[:6]}"
    replacements = (
        ("uri: checkpoints", f"uri: {(tmp_path / 'ckpt').as_uri()}"),
        ("batch_size: 256", "batch_size: 64"),
        # The better candidate must be significantly better, on the same 240 holdout rows.
        ("min_improvement: 0.001", "min_improvement: 0.001\n  confidence: 0.95"),
        # Per-channel scores through the job, the XCom and the gate (a bound any slice meets).
        ("threshold: max_f1               #", "threshold: max_f1\n  slices: [{column: channel}]  #"),
        ("  confidence: 0.95", "  confidence: 0.95\n  slice_guardrail: {max_regression: 1.0, min_rows: 10}"),
    )
    files = write_day((tmp_path / "data").as_uri(), date(2026, 1, 1), 1200, seed=5)
    champion = {"roc_auc": 0.80, "log_loss": 0.30, "recall": 0.50}
    logged = {
        "bootstrap": log_candidate_run(guarded, champion, None, None, model_name=guarded),
        # better primary metric, but log_loss worse by 0.05 (allowed 0.01)
        "breach": log_candidate_run(
            guarded, {"roc_auc": 0.90, "log_loss": 0.35, "recall": 0.50}, champion, "1", model_name=guarded
        ),
        # worse, promoted anyway by force (the trigger form's override)
        "forced": log_candidate_run(
            guarded, {"roc_auc": 0.70, "log_loss": 0.40, "recall": 0.40}, champion, "1", model_name=guarded
        ),
    }
    pipeline = Pipeline(
        tmp_path,
        migrated_airflow_db,
        write_config(tmp_path / "train.yaml", name, replacements),
        write_config(tmp_path / "gate.yaml", guarded),
        files,
        connection,
    )
    runs = pipeline.run(
        # 2 steps: barely trained (bootstrap); 30 steps: better; 2 steps again: worse than that
        ("pipeline_train", {"overrides": {"max_steps": 2}}),
        ("pipeline_train", {"overrides": {"max_steps": 30}, "crash_register": True}),
        ("pipeline_train", {"overrides": {"max_steps": 2}}),
        ("pipeline_gate", {"mlflow_run_id": logged["bootstrap"]}),
        ("pipeline_gate", {"mlflow_run_id": logged["breach"]}),
        ("pipeline_gate", {"mlflow_run_id": logged["forced"], "force": True}),
    )
    _check_trained(pipeline, client, name, *runs[:3])
    _check_guardrail_and_force(pipeline, client, guarded, logged, *runs[3:])
    if backend == "server":
        server = request.getfixturevalue("mlflow_server")
        second = pipeline.xcom(runs[1], "train")
        experiment = second["mlflow_experiment_id"]
        assert (
            pipeline.xcom(runs[1], "train", "_link_MlflowRunLink")
            == f"{server.url}/#/experiments/{experiment}/runs/{second['mlflow_run_id']}"
        )
        assert (
            pipeline.xcom(runs[1], "register", "_link_MlflowModelVersionLink")
            == f"{server.url}/#/models/{name}/versions/2"
        )
        _assert_secret_never_leaks(server.password, pipeline, [tmp_path, server.root])
    else:
        assert pipeline.xcom(runs[1], "train", "_link_MlflowRunLink") == ""  # no UI for the embedded store
        assert pipeline.xcom(runs[1], "register", "_link_MlflowModelVersionLink") == ""
    # The runner resolves the links after every train and register task: never a red line in a green run.
    assert "XCom not found" not in pipeline.output, pipeline.output[-6000:]


def _check_trained(pipeline: Pipeline, client, name: str, bootstrap: str, better: str, worse: str) -> None:
    assert pipeline.tasks(bootstrap)["register"] == ("success", 1)
    first = pipeline.xcom(bootstrap, "train")
    assert (
        first["evaluation"]["champion"] is None
        and pipeline.xcom(bootstrap, "gate")["champion_version"] is None
    )

    # the better candidate: its run holds the champion's metrics on the same holdout, computed now
    second = pipeline.xcom(better, "train")
    assert second["evaluation"]["champion_version"] == "1"
    assert second["evaluation"]["champion"] == pytest.approx(first["evaluation"]["candidate"])
    run = client.get_run(second["mlflow_run_id"])
    assert run.data.metrics["champion_roc_auc"] == pytest.approx(first["evaluation"]["candidate"]["roc_auc"])
    assert run.data.tags["trainpipe.champion.version"] == "1"
    assert run.data.tags["trainpipe.champion.run_id"] == first["mlflow_run_id"]
    decision = pipeline.xcom(better, "gate")
    assert decision["promote"] is True and decision["champion_version"] == "1", decision
    low, high = second["evaluation"]["improvement_interval"]  # the job's paired bootstrap
    assert 0.001 <= low < decision["improvement"] < high and decision["improvement_interval"] == [low, high]
    assert run.data.metrics["improvement_lower"] == low
    slices = second["evaluation"]["slices"]
    assert [s["slice"].split("=")[0] for s in slices] == ["channel"] * len(slices) and len(slices) >= 2
    assert sum(s["rows"] for s in slices) == second["evaluation"]["holdout_rows"]
    assert all(s["champion"] is not None for s in slices)
    assert [c["slice"] for c in decision["slice_checks"]] == [s["slice"] for s in slices if s["rows"] >= 10]
    assert pipeline.tasks(better)["register"] == ("success", 2)  # try 1 crashed after registering
    assert "simulated crash after registering" in pipeline.output
    assert "is already registered as" in pipeline.output

    # the worse candidate: gate succeeds, register skipped, the DAG run is green (asserted in run())
    rejected = pipeline.xcom(worse, "gate")
    assert rejected["promote"] is False and "is not better than the champion's" in rejected["reason"]
    assert "not significant" in rejected["reason"] and rejected["improvement_interval"] is not None
    assert pipeline.tasks(worse)["gate"][0] == "success" and pipeline.tasks(worse)["register"][0] == "skipped"
    assert "keep the champion, skip registration" in pipeline.output
    worse_run = client.get_run(pipeline.xcom(worse, "train")["mlflow_run_id"])
    assert worse_run.data.tags["trainpipe.gate.promote"] == "false"
    assert {a.path for a in client.list_artifacts(worse_run.info.run_id, "gate")} == {
        "gate/comparison.png",
        "gate/decision.json",
        "gate/report.html",
    }
    # The report draws both models' ROC and precision-recall curves from the job's evaluation.json.
    page = Path(client.download_artifacts(worse_run.info.run_id, "gate/report.html")).read_text()
    assert "<b>KEEP THE CHAMPION</b>" in page and ">ROC<" in page and ">Precision-recall<" in page
    assert "Improvement interval (95% paired bootstrap)" in page and "channel=" in page

    versions = client.search_model_versions(f"name = '{name}'")
    assert sorted(int(v.version) for v in versions) == [1, 2]  # the retry added none, the loser none
    assert _aliases(client, name) == {"champion": "2", "previous_champion": "1"}
    v2 = client.get_model_version(name, "2")
    assert v2.run_id == second["mlflow_run_id"]
    assert v2.tags["airflow.dag_run_id"] == better and v2.tags["trainpipe.champion_compared"] == f"{name}/1"
    assert v2.tags["trainpipe.config_hash"].startswith("sha256:") and v2.tags[
        "trainpipe.data_digest"
    ].startswith("sha256:")
    assert (
        v2.tags["trainpipe.transform_hash"]
        == second["transform_hash"]
        == run.data.tags["trainpipe.transform_hash"]
    )
    # evaluation.threshold: max_f1 (the example's): a positive's score, so some fraud is caught,
    # and the version records the score its class metrics were counted at
    candidate = second["evaluation"]["candidate"]
    assert candidate["recall"] > 0 and candidate["threshold"] != 0.5
    assert (
        float(v2.tags["trainpipe.threshold"])
        == candidate["threshold"]
        == run.data.metrics["candidate_threshold"]
    )
    assert json.loads(v2.tags["trainpipe.gate.improvement_interval"]) == [low, high]


def _check_guardrail_and_force(
    pipeline: Pipeline, client, name: str, logged: dict[str, str], bootstrap: str, breach: str, forced: str
) -> None:
    assert pipeline.tasks(bootstrap)["register"][0] == "success"
    assert (
        pipeline.tasks(breach)["register"][0] == "skipped" and pipeline.tasks(breach)["gate"][0] == "success"
    )
    decision = pipeline.xcom(breach, "gate")
    assert decision["promote"] is False and decision["reason"].startswith(
        "guardrail log_loss worsens by 0.05"
    )
    assert [g["passed"] for g in decision["guardrails"]] == [False, True]
    assert "guardrail BREACHED" in pipeline.output
    assert pipeline.tasks(forced)["register"][0] == "success"
    assert pipeline.xcom(forced, "gate")["forced"] is True
    versions = {str(v.version): v for v in client.search_model_versions(f"name = '{name}'")}
    assert sorted(versions) == ["1", "2"] and versions["2"].run_id == logged["forced"]
    assert versions["2"].tags["trainpipe.gate.forced"] == "true"
    assert _aliases(client, name) == {"champion": "2", "previous_champion": "1"}


def _bytes_if_still_there(path: Path) -> bytes:
    # SQLite removes its -wal/-shm files when the last connection closes (their pages are in the
    # database file by then, which is scanned too): a file gone since the listing holds nothing.
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _assert_secret_never_leaks(password: str, pipeline: Pipeline, roots: list[Path]) -> None:
    """Task logs, rendered fields, XComs, the metadata DB, log files, checkpoints, MLflow runs."""
    logged = [line for line in pipeline.output.splitlines() if "environment {'MLFLOW_TRACKING_URI'" in line]
    assert logged, "the careless task logged nothing"
    assert all("'MLFLOW_TRACKING_PASSWORD': '***'" in line for line in logged), logged  # masked
    assert password not in pipeline.output
    files = [path for root in roots for path in root.rglob("*") if path.is_file()]
    leaked = [str(path) for path in files if password.encode() in _bytes_if_still_there(path)]
    assert leaked == [], leaked
    rendered = pipeline._query("select rendered_fields from rendered_task_instance_fields")
    assert rendered and all(password not in str(row) for row in rendered)
