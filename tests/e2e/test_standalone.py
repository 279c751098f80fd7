"""End to end with real processes: `airflow standalone` (api-server, scheduler, dag-processor,
triggerer on SQLite) started the way `make up` starts it, a real `mlflow server` with basic auth,
both on loopback ports. Everything goes through Airflow's REST API v2 with a JWT and through the
MLflow client, as a user would.

One Airflow and one MLflow serve the whole module (startup is the expensive part); the tests run
in file order and share the dags folder, a tmp copy of the repo's loader and configs.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import pytest
import requests

from tests.conftest import REPO_ROOT, free_port

pytestmark = pytest.mark.slow

PARTITION = date(2026, 1, 3)
LOGICAL_DATE = "2026-01-03T02:00:00Z"  # ds = 2026-01-03: the partition written below
BROKEN_FILE = "fraud_broken.yaml"


def _load_up():
    spec = importlib.util.spec_from_file_location("trainpipe_up", REPO_ROOT / "scripts" / "up.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Stack:
    url: str
    session: requests.Session
    configs: Path
    airflow_home: Path
    mlflow: object  # tests.mlflow_server.MlflowServer

    def get(self, path: str, **params) -> dict:
        response = self.session.get(f"{self.url}{path}", params=params, timeout=30)
        assert response.status_code == 200, f"GET {path}: {response.status_code} {response.text[:2000]}"
        return response.json()

    def dag(self, dag_id: str) -> dict | None:
        response = self.session.get(f"{self.url}/api/v2/dags/{dag_id}", timeout=30)
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text[:2000]
        return response.json()

    def wait_for(self, what: str, check, timeout: float, report=lambda: ""):
        deadline = time.monotonic() + timeout
        while (value := check()) is None or value is False:
            if time.monotonic() > deadline:
                log = (self.airflow_home / "standalone.log").read_text(errors="replace")[-4000:]
                raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{report()}\n--- standalone log tail ---\n{log}")
            time.sleep(2)
        return value


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from airflow_trainpipe.synthetic import write_day
    from tests.mlflow_server import start_mlflow_server, stop_mlflow_server

    up = _load_up()
    root = tmp_path_factory.mktemp("e2e")
    dags, home, airflow_home = root / "dags", root / "home", root / "airflow"
    (dags / "configs").mkdir(parents=True)
    airflow_home.mkdir()
    shutil.copy(REPO_ROOT / "dags" / "trainpipe_pipelines.py", dags)
    for config in ("fraud_detector.yaml", "house_prices.yaml"):
        shutil.copy(REPO_ROOT / "dags" / "configs" / config, dags / "configs")
    fraud = (REPO_ROOT / "dags" / "configs" / "fraud_detector.yaml").read_text()
    (dags / "configs" / BROKEN_FILE).write_text(
        fraud.replace("pipeline: fraud_detector", "pipeline: fraud_broken").replace("zero_stage: 1", "zero_stage: 7"))
    for day in (date(2026, 1, 1), date(2026, 1, 2), PARTITION):  # the day before is the drift reference
        write_day((home / "data" / "card_transactions").as_uri(), day, 10_000, seed=day.day)
    # The simple auth manager keeps the passwords it generates in this file and reuses entries
    # that exist, so the test knows the admin password without scraping the log.
    password = "e2e-admin-pw"
    (airflow_home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": password}))

    mlflow = start_mlflow_server(root / "mlflow")
    airflow = None
    try:
        port = free_port()
        env = up.airflow_env(airflow_home, dags, REPO_ROOT / "plugins", home, port, mlflow.connection_json())
        env["TRAINPIPE_CONFIG_CACHE"] = str(root / "config-cache")
        # Only the runs this test triggers: unpausing would otherwise also start today's scheduled run,
        # which waits for a partition that does not exist and holds the DAG's single active-run slot.
        env["AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE"] = "False"
        airflow = up.start_airflow(env, airflow_home / "standalone.log")
        url = f"http://127.0.0.1:{port}"
        try:
            up.wait_http(f"{url}/api/v2/monitor/health", airflow, "airflow standalone", 240)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{(airflow_home / 'standalone.log').read_text(errors='replace')[-4000:]}") from None
        token = requests.post(f"{url}/auth/token", json={"username": "admin", "password": password}, timeout=30)
        assert token.status_code == 201, token.text
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {token.json()['access_token']}"
        yield Stack(url, session, dags / "configs", airflow_home, mlflow)
    finally:
        if airflow is not None:
            up.stop(airflow)
        stop_mlflow_server(mlflow.process)


def test_mlflow_nav_plugin_is_loaded(stack: Stack) -> None:
    plugins = {p["name"]: p for p in stack.get("/api/v2/plugins")["plugins"]}
    assert "trainpipe_mlflow_nav" in plugins, plugins.keys()
    views = plugins["trainpipe_mlflow_nav"]["external_views"]
    # The URL comes from the mlflow_default connection Airflow was started with.
    assert [(v["name"], v["href"], v["destination"]) for v in views] == [("MLflow", stack.mlflow.url, "nav")]


def test_broken_config_is_visible_while_good_dags_load(stack: Stack) -> None:
    stack.wait_for("the pipeline DAGs", lambda: stack.dag("fraud_detector") and stack.dag("house_prices"), 120)
    broken = stack.get("/api/v2/dags", tags="trainpipe:broken-config")["dags"]
    assert [d["dag_id"] for d in broken] == ["fraud_broken"]
    description = broken[0]["description"]
    assert description.startswith(f"BROKEN CONFIG configs/{BROKEN_FILE}: training.deepspeed.zero_stage:"), description
    details = stack.get("/api/v2/dags/fraud_broken/details")
    assert BROKEN_FILE in details["doc_md"] and "zero_stage" in details["doc_md"]
    assert stack.get("/api/v2/importErrors")["import_errors"] == []
    for dag_id in ("fraud_detector", "house_prices"):
        assert "trainpipe:broken-config" not in [t["name"] for t in stack.dag(dag_id)["tags"]]


def _task_report(stack: Stack, run_id: str) -> str:
    tasks = stack.get(f"/api/v2/dags/fraud_detector/dagRuns/{run_id}/taskInstances")["task_instances"]
    lines = [f"{t['task_id']}: {t['state']} (try {t['try_number']})" for t in tasks]
    for t in tasks:
        if t["state"] in ("failed", "up_for_retry", "deferred", "running") and t["try_number"]:
            response = stack.session.get(
                f"{stack.url}/api/v2/dags/fraud_detector/dagRuns/{run_id}/taskInstances/{t['task_id']}/logs/{t['try_number']}",
                headers={"Accept": "application/json"}, timeout=30)
            content = response.json().get("content", []) if response.ok else response.text
            text = "\n".join(e.get("event", str(e)) if isinstance(e, dict) else str(e) for e in content) if isinstance(content, list) else str(content)
            lines.append(f"--- log of {t['task_id']} try {t['try_number']} ---\n{text[-4000:]}")
    return "\n".join(lines)


def test_fraud_detector_runs_and_registers_the_champion(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    response = stack.session.patch(f"{stack.url}/api/v2/dags/fraud_detector", json={"is_paused": False}, timeout=30)
    assert response.status_code == 200, response.text
    response = stack.session.post(f"{stack.url}/api/v2/dags/fraud_detector/dagRuns", timeout=30, json={
        "dag_run_id": "e2e_manual_1", "logical_date": LOGICAL_DATE, "conf": {"hyperparameters": {"epochs": 1, "batch_size": 64}}})
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    # One short epoch (~60 steps on 8000 training rows) through the trigger form's overrides: enough
    # to clear the gate's no-champion floor (roc_auc >= 0.7) that a 3-step model misses.

    def finished():
        state = stack.get(f"/api/v2/dags/fraud_detector/dagRuns/{run_id}")["state"]
        return state if state in ("success", "failed") else None

    state = stack.wait_for(f"dag run {run_id}", finished, 240, report=lambda: _task_report(stack, run_id))
    assert state == "success", _task_report(stack, run_id)
    tasks = {t["task_id"]: t["state"] for t in stack.get(f"/api/v2/dags/fraud_detector/dagRuns/{run_id}/taskInstances")["task_instances"]}
    assert tasks == dict.fromkeys(("wait_for_data", "validate_data", "train", "gate", "register"), "success")

    from mlflow import MlflowClient
    from mlflow.tracking._tracking_service import utils

    for name, value in stack.mlflow.client_env().items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(utils, "_tracking_uri", stack.mlflow.url)
    client = MlflowClient()
    model = client.get_registered_model("fraud_detector")
    assert set(model.aliases) >= {"champion"}
    version = client.get_model_version_by_alias("fraud_detector", "champion")
    assert version.version == "1"
    tags = version.tags
    assert tags["airflow.dag_run_id"] == run_id
    assert tags["airflow.dag_id"] == "fraud_detector"
    for lineage in ("trainpipe.data_digest", "trainpipe.config_hash", "trainpipe.transform_hash", "trainpipe.code_version"):
        assert tags.get(lineage), f"model version misses lineage tag {lineage}: {tags}"
    assert tags["trainpipe.data_digest"].startswith("sha256:")
    run = client.get_run(version.run_id)
    assert run.data.tags["trainpipe.data_digest"] == tags["trainpipe.data_digest"]

    events = stack.get("/api/v2/assets/events", order_by="-timestamp")["asset_events"]
    ours = [e for e in events if e.get("name") == "fraud_detector@champion" or e.get("uri") == "x-mlflow-model://fraud_detector/champion"]
    assert ours and ours[0]["source_run_id"] == run_id, events


def test_yaml_added_changed_and_removed_without_touching_the_loader(stack: Stack) -> None:
    loader = stack.configs.parent / "trainpipe_pipelines.py"
    before = loader.stat().st_mtime_ns
    text = (stack.configs / "house_prices.yaml").read_text()
    assert "pipeline: house_prices" in text
    added = stack.configs / "e2e_added.yaml"
    added.write_text(text.replace("pipeline: house_prices", "pipeline: e2e_added"))
    dag = stack.wait_for("DAG e2e_added to appear", lambda: (d := stack.dag("e2e_added")) and not d["is_stale"] and d, 120)
    assert dag["fileloc"].endswith("trainpipe_pipelines.py")
    added.write_text(added.read_text().replace("description: ", "description: Changed by the e2e test. ", 1))
    stack.wait_for("the changed description", lambda: stack.dag("e2e_added")["description"].startswith("Changed by the e2e test."), 120)
    added.unlink()
    stack.wait_for("DAG e2e_added to go stale", lambda: (d := stack.dag("e2e_added")) is None or d["is_stale"], 120)
    assert not stack.dag("house_prices")["is_stale"]
    assert loader.stat().st_mtime_ns == before
