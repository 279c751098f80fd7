"""DataValidateOperator on a pipeline with a feature store, in dag.test() against real Feast
repos: an unknown feature reference, an entity column missing, a feature view whose feature
changed type since the last run and an offline store that cannot be read each fail the task
before anything is frozen, naming the pipeline, the feature and the cause (so nothing trains or
is registered); only the unreadable store is retried. The trigger form's `accept_feature_changes`
lets the changed view through once, and later runs compare with the new definitions."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from airflow_trainpipe.config import load_config
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.examples.feast_repo import feast_apply, write_repo
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import run_dag_file
from tests.helpers.feast_repo import feast_repo

DAY = date(2026, 1, 2)  # run_dag_file's logical date
DAG = """
from datetime import datetime, timedelta

from airflow.sdk import DAG

from airflow_trainpipe.operators.validate import DataValidateOperator

with DAG("validate_features", schedule=None, start_date=datetime(2026, 1, 1), catchup=False) as dag:
    tasks = {{
        task_id: DataValidateOperator(
            task_id=task_id, config=config, retries=1, retry_delay=timedelta(0), params=params,
            trigger_rule="all_done",
        )
        for task_id, (config, params) in {configs!r}.items()
    }}
    tasks["schema_changed"] >> tasks["accepted"]
"""
CAUSES = {
    "unknown_feature": "card_activity:txn_count_99d",
    "missing_entity_column": "entity column 'merchant_id', the join key of feature view merchant_risk, is missing",
    "schema_changed": "card_activity:txn_count_7d was Int64, is Float64",
    "unreachable": "feature view card_activity: its source",
}


def _config(folder: Path, name: str, uri: Path, repo: Path, **store: Any) -> str:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_features.yaml").read_text())
    config["pipeline"] = f"features_{name}"
    data = config["data"]
    data.pop("window")
    data["uri"] = uri.as_uri()
    data["feature_store"] = {**data["feature_store"], "repo": str(repo), **store}
    config["snapshots"] = {"uri": (folder / "snapshots").as_uri()}
    # The accepted run reads txn_count_7d as a double, and its contract says so.
    config["validation"]["schema"]["columns"]["txn_count_7d"] = "double"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


def _repo_copy(example: Any, repo: Path, card_path: Path | None = None) -> Path:
    write_repo(repo, card_path or example.card_activity, example.merchant_risk)
    feast_apply(repo)
    return repo


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bad_feature_input_stops_before_anything_is_frozen_and_only_an_unreadable_store_is_retried(
    airflow_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = feast_repo(tmp_path / "feast", days=1, rows=1000, start=DAY)
    rows = example.transactions
    # The entity rows without merchant_id, the join key of merchant_risk.
    lacking = tmp_path / "no_merchant" / f"ds={DAY}"
    lacking.mkdir(parents=True)
    pq.write_table(
        pq.read_table(example.transaction_files[0]).drop_columns(["merchant_id"]),
        lacking / "part-00000.parquet",
    )
    (lacking / "_SUCCESS").write_bytes(b"")
    # A repo whose card table went away after it was applied: the offline store cannot read it.
    gone_card = tmp_path / "gone" / "card_activity.parquet"
    gone_card.parent.mkdir()
    shutil.copyfile(example.card_activity, gone_card)
    gone = _repo_copy(example, tmp_path / "gone" / "repo", gone_card)
    gone_card.unlink()
    # A repo joined once (its views recorded), then txn_count_7d re-declared as Float64 and applied.
    # Its first state is a copy of the example's applied repo (registry and online store) with its
    # feature_store.yaml pointing at the copy: the same definitions and views a fresh apply gives
    # (the view hash survives a fresh apply: tests/data/feature_store/test_child.py), without a
    # `feast apply` process (~5 s); the dtype change below is applied to it for real.
    changed = tmp_path / "changed_repo"
    shutil.copytree(example.repo, changed)
    write_repo(changed, example.card_activity, example.merchant_risk)
    configs = {
        "unknown_feature": (
            _config(
                tmp_path / "unknown_feature",
                "unknown_feature",
                rows,
                example.repo,
                feature_service=None,
                features=["card_activity:txn_count_7d", "card_activity:txn_count_99d"],
            ),
            {},
        ),
        "missing_entity_column": (
            _config(
                tmp_path / "missing_entity_column", "missing_entity_column", lacking.parent, example.repo
            ),
            {},
        ),
        "schema_changed": (_config(tmp_path / "changed", "changed", rows, changed), {}),
        "unreachable": (_config(tmp_path / "unreachable", "unreachable", rows, gone), {}),
    }
    configs["accepted"] = (configs["schema_changed"][0], {"accept_feature_changes": True})
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    before = snapshot_for_date(load_config(configs["schema_changed"][0]), DAY.isoformat())
    assert (
        before.features is not None
        and before.features.views["card_activity"].dtypes["txn_count_7d"] == "Int64"
    )
    definitions = changed / "features.py"
    text = definitions.read_text()
    definitions.write_text(
        text.replace('Field(name="txn_count_7d", dtype=Int64)', 'Field(name="txn_count_7d", dtype=Float64)')
    )
    feast_apply(changed)

    run = run_dag_file(airflow_env, "validate_features", DAG.format(configs=configs), DAY.isoformat())
    assert run.tasks == {**dict.fromkeys(CAUSES, "failed"), "accepted": "success"}, run.output[-6000:]
    assert run.tries == {**dict.fromkeys(configs, 1), "unreachable": 2}, run.output[-6000:]
    for task_id, cause in CAUSES.items():
        name = "changed" if task_id == "schema_changed" else task_id
        selection = (
            "card_activity:txn_count_7d, card_activity:txn_count_99d"
            if task_id == "unknown_feature"
            else "feature service fraud_features"
        )
        assert f"pipeline features_{name}, data.feature_store ({selection}): " in run.output, (
            task_id,
            run.output[-6000:],
        )
        assert cause in run.output, (task_id, run.output[-6000:])
    assert "FeatureStoreUnavailable is retryable" in run.output
    assert (
        "FeatureStoreError is not retryable" in run.output
        and "FeatureSchemaChanged is not retryable" in run.output
    )
    for task_id in ("unknown_feature", "missing_entity_column", "unreachable"):
        assert not (tmp_path / task_id / "snapshots").exists(), task_id  # nothing frozen
    # Accepted once: the record now holds the new definition, so the next run compares with it.
    record = json.loads((rows / "_trainpipe" / "feature_views" / "features_changed.json").read_text())
    assert record["views"]["card_activity"]["dtypes"]["txn_count_7d"] == "Float64"
