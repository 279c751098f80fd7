"""PromoteModelOperator of a feature-store pipeline, against real MLflow and a real Feast repo:
the approved version's feature views (from its training run's tags) are loaded into the online
store before @champion moves; a store that cannot be read fails the task, retryably, and moves
nothing."""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.data.feature_store import client
from airflow_trainpipe.data.feature_store.client import FeatureStoreUnavailable
from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.operators.promote import PromoteModelOperator
from airflow_trainpipe.registry.versions import register_candidate
from tests.helpers.feast_repo import START, feast_repo
from tests.helpers.mlflow_backends import gate_decision, write_config
from tests.helpers.mlflow_server import log_candidate_run
from tests.operators.conftest import APPROVAL, LOG, TaskInstance, aliases, answer

pytestmark = pytest.mark.slow


def _context(result: dict, decision, approval: dict) -> dict:
    approval = {k: v for k, v in approval.items() if k != "timedout"}
    xcoms = {("register", "return_value"): result, ("gate", "return_value"): decision.as_dict()}
    return {"ti": TaskInstance(xcoms={**xcoms, ("approve", "return_value"): approval})}


def test_approval_loads_the_version_s_views_online_before_the_champion_moves(
    logged_runs: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    connection, first, _ = logged_runs
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", connection)
    example = feast_repo(tmp_path / "feast", days=1, rows=400)
    name = f"apv_{uuid.uuid4().hex[:8]}"
    store = (
        "  format: parquet\n  feature_store:\n"
        f"    repo: {example.repo}\n    features: [card_activity:txn_count_7d]\n    timestamp_column: event_time\n"
    )
    config = load_config(write_config(tmp_path / "c.yaml", name, (*APPROVAL, ("  format: parquet\n", store))))
    hook = MlflowHook()
    with hook.activated():
        register_candidate(
            hook,
            load_config(write_config(tmp_path / "plain.yaml", name)),
            first,
            gate_decision(),
            {},
            log=LOG,
        )
        start = datetime.combine(START, datetime.min.time(), UTC).isoformat()
        second = log_candidate_run(
            "approval_features",
            {"roc_auc": 0.85},
            {"roc_auc": 0.8},
            "1",
            model_name=name,
            tags={
                "trainpipe.feast_feature_views": "card_activity",
                "trainpipe.feast_entity_time": f"{start} .. {start}",
            },
        )
        decision = gate_decision(champion_version="1", candidate=0.85, champion=0.8, improvement=0.05)
        result = register_candidate(hook, config, second, decision, {}, log=LOG)
        assert aliases(hook, name) == {"champion": "1", "challenger": "2"}  # staged: nothing loaded yet
        operator = PromoteModelOperator(task_id="promote", config=config)

        # The card table went away: nothing can be loaded, so the champion does not move.
        moved = example.card_activity.with_suffix(".moved")
        shutil.move(example.card_activity, moved)
        with pytest.raises(FeatureStoreUnavailable, match="so the champion does not move"):
            operator.execute(_context(result, decision, answer("Approve")))
        assert aliases(hook, name) == {"champion": "1", "challenger": "2"}

        shutil.move(moved, example.card_activity)
        out = operator.execute(_context(result, decision, answer("Approve")))
        assert out["promoted"] and aliases(hook, name) == {"champion": "2", "previous_champion": "1"}
        tags = hook.get_conn().get_model_version(name, "2").tags
    assert tags["trainpipe.feast_materialized_views"] == "card_activity"
    served = pq.read_table(
        client.online_features(
            python=None,
            repo=example.repo,
            entity_file=example.transaction_files[0],
            output=tmp_path / "served.parquet",
            features=["card_activity:txn_count_7d"],
        )
    )
    assert served["txn_count_7d"].null_count < served.num_rows // 10  # loaded, though older than now - ttl
