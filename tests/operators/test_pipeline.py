"""train -> gate -> register through Airflow's own dag.test(), against a real `mlflow server` with
basic auth and against the embedded sqlite store.

One subprocess runs several DAG runs in a row (each dag.test() is a real DAG run in a real
Airflow metadata DB); the test then reads task states, XComs and the MLflow registry.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from datetime import date
from pathlib import Path

import pytest

from tests.mlflow_server import log_candidate_run
from tests.operators.mlflow_backends import BACKENDS, write_config

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

CONFIG = __CONFIG__


class RegisterCrashingOnce(RegisterModelOperator):
    """With conf crash_register: try 1 registers the version, then dies before returning."""

    def execute(self, context):
        result = super().execute(context)
        if context["dag_run"].conf.get("crash_register") and context["ti"].try_number == 1:
            raise RuntimeError("simulated crash after registering")
        return result


with DAG("__DAG_ID__", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         render_template_as_native_obj=True) as dag:
    if __TRAIN__:
        upstream = DistributedTrainOperator(
            task_id="train", config=CONFIG, data_files=__FILES__, nproc=1,
            hyperparameter_overrides="{{ dag_run.conf.get('overrides', {}) }}",
        )
        run_id = None
    else:
        upstream = None
        run_id = "{{ dag_run.conf['mlflow_run_id'] }}"
    gate = BaselineGateOperator(task_id="gate", config=CONFIG, mlflow_run_id=run_id,
                                force="{{ dag_run.conf.get('force', False) }}")
    register = RegisterCrashingOnce(task_id="register", config=CONFIG, retries=1, retry_delay=timedelta(seconds=0))
    if upstream is not None:
        upstream >> gate
    gate >> register

    @task
    def log_connection_environment():
        """What a careless DAG author might log: the masker must hide the secret."""
        logging.getLogger("airflow.task").info("environment %s", MlflowHook().environment())

    log_connection_environment()

if __name__ == "__main__":
    # dag.test() runs tasks in this process and prints their logs with airflow-core's console
    # logging; a worker's supervisor writes task logs through the task SDK's processors, which
    # redact registered secrets. Use those, so the output shows what a task log would.
    from airflow.sdk.log import configure_logging

    configure_logging(output=sys.stdout, colored_console_log=False)
    for conf in json.loads(sys.argv[1]):
        run = dag.test(run_conf=conf)
        print("TEST-RUN " + json.dumps({"run_id": run.run_id, "state": str(run.state)}), flush=True)
'''


class Pipeline:
    """A dags folder, an Airflow home and a TRAINPIPE_HOME in tmp_path; runs the DAG for each conf."""

    def __init__(self, tmp_path: Path, config: Path, train: bool, files: list[str] | None, connection: str | None):
        self.tmp_path, self.dag_id = tmp_path, "pipeline_train" if train else "pipeline_gate"
        dags = tmp_path / "dags"
        dags.mkdir(exist_ok=True)
        text = (DAG_FILE.replace("__CONFIG__", repr(str(config))).replace("__DAG_ID__", self.dag_id)
                .replace("__TRAIN__", repr(train)).replace("__FILES__", repr(files)))
        self.dag_file = dags / f"{self.dag_id}.py"
        self.dag_file.write_text(text)
        self.airflow_home = tmp_path / "airflow"
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "TRAINPIPE_HOME": str(tmp_path / "home"),
        }
        for name in ("AIRFLOW_CONN_MLFLOW_DEFAULT", "MLFLOW_TRACKING_URI", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"):
            self.env.pop(name, None)
        if connection:
            self.env["AIRFLOW_CONN_MLFLOW_DEFAULT"] = connection
        airflow = Path(sys.executable).parent / "airflow"
        subprocess.run([str(airflow), "db", "migrate"], env=self.env, check=True, capture_output=True, timeout=300)
        self.output = ""

    def run(self, *confs: dict) -> list[str]:
        done = subprocess.run([sys.executable, str(self.dag_file), json.dumps(list(confs))], env=self.env,
                              capture_output=True, text=True, timeout=600)
        self.output += done.stdout + done.stderr
        assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
        runs = [json.loads(line.split("TEST-RUN ", 1)[1]) for line in done.stdout.splitlines() if "TEST-RUN " in line]
        assert [r["state"] for r in runs] == ["success"] * len(confs), self.output[-6000:]
        return [r["run_id"] for r in runs]

    def _query(self, sql: str, *args: object) -> list[tuple]:
        with sqlite3.connect(self.airflow_home / "airflow.db") as db:
            return db.execute(sql, args).fetchall()

    def tasks(self, run_id: str) -> dict[str, tuple[str, int]]:
        rows = self._query("select task_id, state, try_number from task_instance where dag_id = ? and run_id = ?", self.dag_id, run_id)
        return {task_id: (state, tries) for task_id, state, tries in rows}

    def xcom(self, run_id: str, task_id: str, key: str = "return_value"):
        rows = self._query("select value from xcom where dag_id = ? and run_id = ? and task_id = ? and key = ?", self.dag_id, run_id, task_id, key)
        return json.loads(rows[0][0]) if rows else None


def _registry(backend: str, request: pytest.FixtureRequest, tmp_path: Path):
    """(connection JSON or None for the embedded default, environment for this process's client)."""
    if backend == "server":
        server = request.getfixturevalue("mlflow_server")
        return server.connection_json(), server.client_env()
    return None, {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'home' / 'mlflow.db'}"}


def _client(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]):
    import mlflow
    from mlflow import MlflowClient

    from mlflow.tracking._tracking_service import utils

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(utils, "_tracking_uri", env["MLFLOW_TRACKING_URI"])  # restored after the test
    return MlflowClient()


def _aliases(client, name: str) -> dict[str, str]:
    return {alias: str(version) for alias, version in client.get_registered_model(name).aliases.items()}


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_bootstrap_promote_reject_and_retry_through_dag_test(backend: str, request: pytest.FixtureRequest,
                                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from airflow_trainpipe.synthetic import write_day

    connection, client_env = _registry(backend, request, tmp_path)
    name = f"e2e_{backend}_{uuid.uuid4().hex[:6]}"
    replacements = (("uri: checkpoints", f"uri: {(tmp_path / 'ckpt').as_uri()}"), ("batch_size: 256", "batch_size: 64"))
    config = write_config(tmp_path / "pipeline.yaml", name, replacements)
    files = write_day((tmp_path / "data").as_uri(), date(2026, 1, 1), 1200, seed=5)
    pipeline = Pipeline(tmp_path, config, train=True, files=files, connection=connection)
    # 2 steps: barely trained (bootstrap); 30 steps: better; 2 steps again: worse than that
    bootstrap, better, worse = pipeline.run(
        {"overrides": {"max_steps": 2}},
        {"overrides": {"max_steps": 30}, "crash_register": True},
        {"overrides": {"max_steps": 2}},
    )
    client = _client(monkeypatch, client_env)

    assert pipeline.tasks(bootstrap)["register"] == ("success", 1)
    first = pipeline.xcom(bootstrap, "train")
    assert first["evaluation"]["champion"] is None and pipeline.xcom(bootstrap, "gate")["champion_version"] is None

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
    assert pipeline.tasks(better)["register"] == ("success", 2)  # try 1 crashed after registering
    assert "simulated crash after registering" in pipeline.output
    assert "is already registered as" in pipeline.output

    # the worse candidate: gate succeeds, register skipped, the DAG run is green (asserted in run())
    rejected = pipeline.xcom(worse, "gate")
    assert rejected["promote"] is False and "is not better than the champion's" in rejected["reason"]
    assert pipeline.tasks(worse)["gate"][0] == "success" and pipeline.tasks(worse)["register"][0] == "skipped"
    assert "keep the champion, skip registration" in pipeline.output
    worse_run = client.get_run(pipeline.xcom(worse, "train")["mlflow_run_id"])
    assert worse_run.data.tags["trainpipe.gate.promote"] == "false"
    assert {a.path for a in client.list_artifacts(worse_run.info.run_id, "gate")} == {"gate/comparison.png", "gate/decision.json"}

    versions = client.search_model_versions(f"name = '{name}'")
    assert sorted(int(v.version) for v in versions) == [1, 2]  # the retry added none, the loser none
    assert _aliases(client, name) == {"champion": "2", "previous_champion": "1"}
    v2 = client.get_model_version(name, "2")
    assert v2.run_id == second["mlflow_run_id"]
    assert v2.tags["airflow.dag_run_id"] == better and v2.tags["trainpipe.champion_compared"] == f"{name}/1"
    assert v2.tags["trainpipe.config_hash"].startswith("sha256:") and v2.tags["trainpipe.data_digest"].startswith("sha256:")

    if backend == "server":
        server = request.getfixturevalue("mlflow_server")
        experiment = second["mlflow_experiment_id"]
        assert pipeline.xcom(better, "train", "_link_MlflowRunLink") == f"{server.url}/#/experiments/{experiment}/runs/{second['mlflow_run_id']}"
        assert pipeline.xcom(better, "register", "_link_MlflowModelVersionLink") == f"{server.url}/#/models/{name}/versions/2"
        _assert_secret_never_leaks(server.password, pipeline, [tmp_path, server.root])
    else:
        assert pipeline.xcom(better, "train", "_link_MlflowRunLink") in (None, "")  # no UI for the embedded store


def _assert_secret_never_leaks(password: str, pipeline: Pipeline, roots: list[Path]) -> None:
    """Task logs, rendered fields, XComs, the metadata DB, log files, checkpoints, MLflow runs."""
    logged = [line for line in pipeline.output.splitlines() if "environment {'MLFLOW_TRACKING_URI'" in line]
    assert logged, "the careless task logged nothing"
    assert all("'MLFLOW_TRACKING_PASSWORD': '***'" in line for line in logged), logged  # masked
    assert password not in pipeline.output
    files = [path for root in roots for path in root.rglob("*") if path.is_file()]
    leaked = [str(path) for path in files if password.encode() in path.read_bytes()]
    assert leaked == [], leaked
    rendered = pipeline._query("select rendered_fields from rendered_task_instance_fields")
    assert rendered and all(password not in str(row) for row in rendered)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_guardrail_breach_is_not_registered_and_force_promotes(backend: str, request: pytest.FixtureRequest,
                                                              monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Real MLflow runs with logged metrics and a small logged model stand in for training."""
    connection, client_env = _registry(backend, request, tmp_path)
    (tmp_path / "home").mkdir()
    name = f"guard_{backend}_{uuid.uuid4().hex[:6]}"
    config = write_config(tmp_path / "pipeline.yaml", name)
    client = _client(monkeypatch, client_env)
    champion = {"roc_auc": 0.80, "log_loss": 0.30, "recall": 0.50}
    runs = {
        "bootstrap": log_candidate_run(name, champion, None, None, model_name=name),
        # better primary metric, but log_loss worse by 0.05 (allowed 0.01)
        "breach": log_candidate_run(name, {"roc_auc": 0.90, "log_loss": 0.35, "recall": 0.50}, champion, "1", model_name=name),
        # worse, promoted anyway by force (the trigger form's override)
        "forced": log_candidate_run(name, {"roc_auc": 0.70, "log_loss": 0.40, "recall": 0.40}, champion, "1", model_name=name),
    }
    pipeline = Pipeline(tmp_path, config, train=False, files=None, connection=connection)
    bootstrap, breach, forced = pipeline.run(
        {"mlflow_run_id": runs["bootstrap"]}, {"mlflow_run_id": runs["breach"]}, {"mlflow_run_id": runs["forced"], "force": True},
    )
    assert pipeline.tasks(bootstrap)["register"][0] == "success"
    assert pipeline.tasks(breach)["register"][0] == "skipped"
    decision = pipeline.xcom(breach, "gate")
    assert decision["promote"] is False and decision["reason"].startswith("guardrail log_loss worsens by 0.05")
    assert [g["passed"] for g in decision["guardrails"]] == [False, True]
    assert "guardrail BREACHED" in pipeline.output
    assert pipeline.tasks(forced)["register"][0] == "success"
    assert pipeline.xcom(forced, "gate")["forced"] is True
    versions = {str(v.version): v for v in client.search_model_versions(f"name = '{name}'")}
    assert sorted(versions) == ["1", "2"] and versions["2"].run_id == runs["forced"]
    assert versions["2"].tags["trainpipe.gate.forced"] == "true"
    assert _aliases(client, name) == {"champion": "2", "previous_champion": "1"}
