"""`make up DB=postgres` end to end: `airflow standalone` on a PostgreSQL metadata database (a
cluster of its own, started by scripts/up.py's code, as `make up DB=postgres` starts it), the
LocalExecutor, and one fraud_detector run through the REST API. What Airflow wrote is read back
from PostgreSQL itself: the run, its tasks, the training pool `make up` applies, and no SQLite
database beside it.

This module starts and stops its own stack (module scope), not the package's SQLite one, so it
costs one stack startup and one short training run. It runs before the package's stack starts
(conftest.py), so the two stacks never run side by side.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.conftest import PARTITION, Stack, running_stack

pytestmark = pytest.mark.slow

DAG = "fraud_detector"
TASKS = ("wait_for_data", "validate_data", "train", "gate", "register")
FAST = {"hyperparameters": {"epochs": 1, "batch_size": 64}}  # clears the bootstrap floor (test_standalone)


@pytest.fixture(scope="module")
def postgres_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("e2e_postgres"), database="postgres") as stack:
        yield stack


@pytest.mark.timeout(900)  # the stack's startup (~2 min on 2 cores) counts in the first test
def test_a_pipeline_runs_on_postgresql_with_the_local_executor(postgres_stack: Stack) -> None:
    stack = postgres_stack
    assert stack.database_url.startswith("postgresql+psycopg://postgres@127.0.0.1:"), stack.database_url
    assert stack.airflow_env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    stack.wait_for("the fraud_detector DAG", lambda: stack.dag(DAG), 120)
    response = stack.session.patch(f"{stack.url}/api/v2/dags/{DAG}", json={"is_paused": False}, timeout=30)
    assert response.status_code == 200, response.text
    run_id = "postgres_manual_1"
    response = stack.session.post(
        f"{stack.url}/api/v2/dags/{DAG}/dagRuns",
        json={"dag_run_id": run_id, "logical_date": f"{PARTITION}T02:00:00Z", "conf": FAST},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    assert stack.wait_for_run(DAG, run_id, 300) == "success", stack.task_report(DAG, run_id)

    with stack.database_connect() as db:
        runs = db.execute("SELECT run_id, state FROM dag_run WHERE dag_id = %s", (DAG,)).fetchall()
        assert runs == [(run_id, "success")]
        tasks = db.execute(
            "SELECT task_id, state, pool, pool_slots, executor, queued_by_job_id FROM task_instance "
            "WHERE dag_id = %s AND run_id = %s",
            (DAG, run_id),
        ).fetchall()
        assert {task: state for task, state, *_ in tasks} == dict.fromkeys(TASKS, "success")
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
