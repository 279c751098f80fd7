"""`make up DB=postgres` end to end, scheduling a pipeline on a partitioned asset: `airflow
standalone` on a PostgreSQL metadata database (a cluster of its own, started by scripts/up.py's
code, as `make up DB=postgres` starts it) with the LocalExecutor and the scheduler creating runs.
An upstream DAG says it landed a day (a partition of its asset, `schedule.asset_partitions`), the
scheduler starts one run of the pipeline keyed by that day, and `data.window` trains on the days
ending there. What Airflow wrote is read back from PostgreSQL itself: the runs, their tasks, the
training pool `make up` applies, and no SQLite database beside it.

One stack and one training run for both subjects: the asset-triggered run is the one whose rows
are read back. This module starts and stops its own stack (module scope), not the package's
SQLite one; it runs before that one starts (conftest.py), so the two never run side by side.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.conftest import Stack, running_stack

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).parent / "dags" / "land_card_transactions.py"
DAG = "fraud_on_landing"


def _pipeline_config() -> str:
    """fraud_detector, run per landed day of `card_transactions_days` on the 3 days ending there."""
    text = (REPO_ROOT / "dags" / "configs" / "fraud_detector.yaml").read_text()
    replacements = {
        "pipeline: fraud_detector": f"pipeline: {DAG}",
        'cron: "0 2 * * *"          # 02:00 UTC, after the upstream export lands': (
            "asset: card_transactions_days\n  asset_partitions: key"
        ),
        'partition: "ds={{ ds }}"': 'partition: "ds={{ partition_key }}"\n  window: {partitions: 3}',
        "model_name: fraud_detector": f"model_name: {DAG}",
        # One short epoch (~375 steps of 64 on 3 x 8000 training rows) clears the gate's
        # no-champion floor (roc_auc >= 0.7).
        "epochs: 3": "epochs: 1",
        "batch_size: 256": "batch_size: 64",
    }
    for old, new in replacements.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


@pytest.fixture(scope="module")
def postgres_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    files = {
        "land_card_transactions.py": UPSTREAM.read_text(),
        f"configs/{DAG}.yaml": _pipeline_config(),
    }
    root = tmp_path_factory.mktemp("e2e_postgres")
    with running_stack(root, database="postgres", scheduled_runs=True, dag_files=files) as stack:
        yield stack


@pytest.mark.timeout(900)  # the stack's startup (~1-2 min on 2 cores) counts in the test
def test_a_landed_partition_starts_a_windowed_run_on_postgresql_with_the_local_executor(
    postgres_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = postgres_stack
    assert stack.database_url.startswith("postgresql+psycopg://postgres@127.0.0.1:"), stack.database_url
    assert stack.airflow_env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    stack.wait_for(
        f"DAGs {DAG} and land_card_transactions",
        lambda: stack.dag(DAG) and stack.dag("land_card_transactions"),
        120,
    )
    assert stack.dag(DAG)["timetable_summary"], stack.dag(DAG)
    for dag_id in (DAG, "land_card_transactions"):
        response = stack.session.patch(
            f"{stack.url}/api/v2/dags/{dag_id}", json={"is_paused": False}, timeout=30
        )
        assert response.status_code == 200, response.text
    response = stack.session.post(
        f"{stack.url}/api/v2/dags/land_card_transactions/dagRuns",
        json={"logical_date": None, "conf": {"day": "2026-01-03"}},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    landed = response.json()["dag_run_id"]
    state = stack.wait_for_run("land_card_transactions", landed, 180)
    assert state == "success", stack.task_report("land_card_transactions", landed)

    def started() -> dict | None:
        runs = stack.get(f"/api/v2/dags/{DAG}/dagRuns")["dag_runs"]
        return runs[0] if runs else None

    run = stack.wait_for("the run the landed partition starts", started, 120)
    assert (run["run_type"], run["partition_key"], run["logical_date"]) == (
        "asset_triggered",
        "2026-01-03",
        None,
    )
    run_id = run["dag_run_id"]
    state = stack.wait_for_run(DAG, run_id, 300)
    assert state == "success", stack.task_report(DAG, run_id)
    assert stack.get(f"/api/v2/dags/{DAG}/dagRuns")["total_entries"] == 1

    client = stack.mlflow_client(monkeypatch)
    version = client.get_model_version_by_alias(DAG, "champion")
    assert version.tags["airflow.dag_run_id"] == run_id
    tags = client.get_run(version.run_id).data.tags
    assert tags["trainpipe.data_window"] == "ds=2026-01-01 .. ds=2026-01-03", tags
    assert (tags["trainpipe.data_partitions"], tags["trainpipe.data_missing"]) == ("3", "-")

    task_ids = {task["task_id"] for task in stack.get(f"/api/v2/dags/{DAG}/tasks")["tasks"]}
    assert {"train", "gate", "register"} <= task_ids, task_ids
    with stack.database_connect() as db:
        runs = db.execute(
            "SELECT dag_id, run_id, state FROM dag_run WHERE dag_id IN (%s, %s) ORDER BY dag_id",
            (DAG, "land_card_transactions"),
        ).fetchall()
        assert runs == [(DAG, run_id, "success"), ("land_card_transactions", landed, "success")]
        tasks = db.execute(
            "SELECT task_id, state, pool, pool_slots, executor, queued_by_job_id FROM task_instance "
            "WHERE dag_id = %s AND run_id = %s",
            (DAG, run_id),
        ).fetchall()
        assert {task: state for task, state, *_ in tasks} == dict.fromkeys(task_ids, "success")
        # The train task took its ranks of the training pool that `make up` applies (ensure_pools).
        assert [(pool, slots) for task, _, pool, slots, *_ in tasks if task == "train"] == [
            ("trainpipe_training", 2)
        ]
        pools = dict(db.execute("SELECT pool, slots FROM slot_pool").fetchall())
        assert pools.get("trainpipe_training", 0) >= 2, pools
        # The executor: no task names one (NULL: the default executor), the scheduler queued them
        # all, and the scheduler's default executor is the LocalExecutor (it logs what it loaded).
        assert {executor for *_, executor, _ in tasks} == {None}
        (scheduler,) = db.execute("SELECT id FROM job WHERE job_type = 'SchedulerJob'").fetchone() or (None,)
        assert {job for *_, job in tasks} == {scheduler}, tasks
    log = (stack.airflow_home / "standalone.log").read_text(errors="replace")
    assert "Loaded executor: :LocalExecutor:" in log
    assert "Forcing executor" not in log  # standalone took the configured executor as it is
    assert not (stack.airflow_home / "airflow.db").exists()  # nothing fell back to SQLite
