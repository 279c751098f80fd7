"""A pipeline scheduled on a partitioned asset (`schedule.asset_partitions`), end to end: an
upstream DAG says it landed a day (a partition of its asset), the scheduler starts one run of the
pipeline keyed by that day, and `data.window` trains on the days ending there.

Its own stack, with the scheduler creating runs (the shared one of test_standalone.py leaves that
off); this module runs before that one starts (conftest.py runs the shared stack's modules
last), so the two never run together.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.integration.conftest import Stack, running_stack

pytestmark = pytest.mark.slow

UPSTREAM = Path(__file__).parent / "dags" / "land_card_transactions.py"


def _pipeline_config() -> str:
    """fraud_detector, run per landed day of `card_transactions_days` on the 3 days ending there."""
    text = (REPO_ROOT / "dags" / "configs" / "fraud_detector.yaml").read_text()
    replacements = {
        "pipeline: fraud_detector": "pipeline: fraud_on_landing",
        'cron: "0 2 * * *"          # 02:00 UTC, after the upstream export lands': (
            "asset: card_transactions_days\n  asset_partitions: key"
        ),
        'partition: "ds={{ ds }}"': 'partition: "ds={{ partition_key }}"\n  window: {partitions: 3}',
        "model_name: fraud_detector": "model_name: fraud_on_landing",
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
def landing_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    files = {
        "land_card_transactions.py": UPSTREAM.read_text(),
        "configs/fraud_on_landing.yaml": _pipeline_config(),
    }
    with running_stack(tmp_path_factory.mktemp("landing"), scheduled_runs=True, dag_files=files) as stack:
        yield stack


def test_a_landed_partition_starts_a_windowed_run_that_ends_at_it(
    landing_stack: Stack, monkeypatch: pytest.MonkeyPatch
) -> None:
    stack = landing_stack
    stack.wait_for(
        "DAGs fraud_on_landing and land_card_transactions",
        lambda: stack.dag("fraud_on_landing") and stack.dag("land_card_transactions"),
        120,
    )
    assert stack.dag("fraud_on_landing")["timetable_summary"], stack.dag("fraud_on_landing")
    for dag_id in ("fraud_on_landing", "land_card_transactions"):
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
        runs = stack.get("/api/v2/dags/fraud_on_landing/dagRuns")["dag_runs"]
        return runs[0] if runs else None

    run = stack.wait_for("the run the landed partition starts", started, 120)
    assert (run["run_type"], run["partition_key"], run["logical_date"]) == (
        "asset_triggered",
        "2026-01-03",
        None,
    )
    state = stack.wait_for_run("fraud_on_landing", run["dag_run_id"], 300)
    assert state == "success", stack.task_report("fraud_on_landing", run["dag_run_id"])
    assert stack.get("/api/v2/dags/fraud_on_landing/dagRuns")["total_entries"] == 1

    client = stack.mlflow_client(monkeypatch)
    version = client.get_model_version_by_alias("fraud_on_landing", "champion")
    assert version.tags["airflow.dag_run_id"] == run["dag_run_id"]
    tags = client.get_run(version.run_id).data.tags
    assert tags["trainpipe.data_window"] == "ds=2026-01-01 .. ds=2026-01-03", tags
    assert (tags["trainpipe.data_partitions"], tags["trainpipe.data_missing"]) == ("3", "-")
