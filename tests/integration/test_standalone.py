"""End to end with real processes: `airflow standalone` (api-server, scheduler, dag-processor,
triggerer on SQLite) started the way `make up` starts it, a real `mlflow server` with basic auth,
both on loopback ports. Everything goes through Airflow's REST API v2 with a JWT and through the
MLflow client, as a user would.

The stack (conftest.py) serves the whole session; the tests run in file order and share its dags
folder, a tmp copy of the repo's loader and configs. This module runs before test_ui_browser.py
(file order): its registry assertions expect an empty registry.
"""

from __future__ import annotations

import pytest

from tests.integration.conftest import BROKEN_FILE, Stack

pytestmark = pytest.mark.slow

LOGICAL_DATE = "2026-01-03T02:00:00Z"  # ds = 2026-01-03: conftest.PARTITION, written by the stack


def test_mlflow_nav_plugin_is_loaded(stack: Stack) -> None:
    plugins = {p["name"]: p for p in stack.get("/api/v2/plugins")["plugins"]}
    assert "trainpipe_mlflow_nav" in plugins, plugins.keys()
    views = plugins["trainpipe_mlflow_nav"]["external_views"]
    # The URL comes from the mlflow_default connection Airflow was started with.
    assert [(v["name"], v["href"], v["destination"]) for v in views] == [("MLflow", stack.mlflow.url, "nav")]


def test_broken_config_is_visible_while_good_dags_load(stack: Stack) -> None:
    stack.wait_for(
        "the pipeline DAGs", lambda: stack.dag("fraud_detector") and stack.dag("house_prices"), 120
    )
    broken = stack.get("/api/v2/dags", tags="trainpipe:broken-config")["dags"]
    assert [d["dag_id"] for d in broken] == ["fraud_broken"]
    description = broken[0]["description"]
    assert description.startswith(f"BROKEN CONFIG configs/{BROKEN_FILE}: training.deepspeed.zero_stage:"), (
        description
    )
    details = stack.get("/api/v2/dags/fraud_broken/details")
    assert BROKEN_FILE in details["doc_md"] and "zero_stage" in details["doc_md"]
    assert stack.get("/api/v2/importErrors")["import_errors"] == []
    for dag_id in ("fraud_detector", "house_prices"):
        assert "trainpipe:broken-config" not in [t["name"] for t in stack.dag(dag_id)["tags"]]


def test_fraud_detector_runs_and_registers_the_champion(
    stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    response = stack.session.patch(
        f"{stack.url}/api/v2/dags/fraud_detector", json={"is_paused": False}, timeout=30
    )
    assert response.status_code == 200, response.text
    response = stack.session.post(
        f"{stack.url}/api/v2/dags/fraud_detector/dagRuns",
        timeout=30,
        json={
            "dag_run_id": "e2e_manual_1",
            "logical_date": LOGICAL_DATE,
            "conf": {"hyperparameters": {"epochs": 1, "batch_size": 64}},
        },
    )
    assert response.status_code == 200, response.text
    run_id = response.json()["dag_run_id"]
    # One short epoch (~60 steps on 8000 training rows) through the trigger form's overrides: enough
    # to clear the gate's no-champion floor (roc_auc >= 0.7) that a 3-step model misses.

    state = stack.wait_for_run("fraud_detector", run_id, 240)
    assert state == "success", stack.task_report("fraud_detector", run_id)
    tasks = stack.task_states("fraud_detector", run_id)
    assert tasks == dict.fromkeys(("wait_for_data", "validate_data", "train", "gate", "register"), "success")

    client = stack.mlflow_client(monkeypatch)
    model = client.get_registered_model("fraud_detector")
    assert set(model.aliases) >= {"champion"}
    version = client.get_model_version_by_alias("fraud_detector", "champion")
    assert version.version == "1"
    tags = version.tags
    assert tags["airflow.dag_run_id"] == run_id
    assert tags["airflow.dag_id"] == "fraud_detector"
    for lineage in (
        "trainpipe.data_digest",
        "trainpipe.config_hash",
        "trainpipe.transform_hash",
        "trainpipe.code_version",
    ):
        assert tags.get(lineage), f"model version misses lineage tag {lineage}: {tags}"
    assert tags["trainpipe.data_digest"].startswith("sha256:")
    run = client.get_run(version.run_id)
    assert run.data.tags["trainpipe.data_digest"] == tags["trainpipe.data_digest"]

    events = stack.get("/api/v2/assets/events", order_by="-timestamp")["asset_events"]
    ours = [
        e
        for e in events
        if e.get("name") == "fraud_detector@champion"
        or e.get("uri") == "x-mlflow-model://fraud_detector/champion"
    ]
    assert ours and ours[0]["source_run_id"] == run_id, events


def test_yaml_added_changed_and_removed_without_touching_the_loader(stack: Stack) -> None:
    loader = stack.configs.parent / "trainpipe_pipelines.py"
    before = loader.stat().st_mtime_ns
    text = (stack.configs / "house_prices.yaml").read_text()
    assert "pipeline: house_prices" in text
    added = stack.configs / "e2e_added.yaml"
    added.write_text(text.replace("pipeline: house_prices", "pipeline: e2e_added"))
    dag = stack.wait_for(
        "DAG e2e_added to appear", lambda: (d := stack.dag("e2e_added")) and not d["is_stale"] and d, 120
    )
    assert dag["fileloc"].endswith("trainpipe_pipelines.py")
    added.write_text(added.read_text().replace("description: ", "description: Changed by the e2e test. ", 1))
    stack.wait_for(
        "the changed description",
        lambda: stack.dag("e2e_added")["description"].startswith("Changed by the e2e test."),
        120,
    )
    added.unlink()
    stack.wait_for(
        "DAG e2e_added to go stale", lambda: (d := stack.dag("e2e_added")) is None or d["is_stale"], 120
    )
    assert not stack.dag("house_prices")["is_stale"]
    assert loader.stat().st_mtime_ns == before
