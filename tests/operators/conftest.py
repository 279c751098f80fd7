"""Fixtures of the approval tests (test_approval.py, test_promote.py): a candidate staged for approval
in a real MLflow registry (the embedded store; the REST test in tests/integration covers the server)."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_trainpipe.config import load_config
from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.registry.versions import register_candidate
from tests.helpers.mlflow_backends import gate_decision, write_config
from tests.helpers.mlflow_server import log_candidate_run

LOG = logging.getLogger("test")
APPROVAL = (("tags: {team: risk-ml}", "tags: {team: risk-ml}\n  approval: required\n  approval_timeout: 1h"),)


class TaskInstance(SimpleNamespace):
    def xcom_pull(self, task_ids: str, key: str = "return_value"):
        return self.xcoms.get((task_ids, key))


def answer(option: str, user: str | None = "alice", reason: str = "", timedout: bool = False) -> dict:
    """The event Airflow resumes execute_complete with (models/hitl.py as_resume_event_payload)."""
    return {
        "chosen_options": [option],
        "params_input": {"reason": reason},
        "responded_at": datetime.now(UTC),
        "responded_by_user": {"id": user, "name": user} if user else None,
        "timedout": timedout,
    }


@pytest.fixture(scope="session")
def logged_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    """(connection, champion run, candidate run), logged once: each test registers them into a
    model of its own. The embedded store only: the REST test (tests/integration) covers the server."""
    store = tmp_path_factory.mktemp("approval_store")
    connection = json.dumps(
        {"conn_type": "mlflow", "extra": {"tracking_uri": f"sqlite:///{store / 'mlflow.db'}"}}
    )
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", connection)
        with MlflowHook().activated():
            first = log_candidate_run("approval", {"roc_auc": 0.8}, None, None, model_name="approval")
            second = log_candidate_run(
                "approval", {"roc_auc": 0.85}, {"roc_auc": 0.8}, "1", model_name="approval"
            )
    return connection, first, second


@pytest.fixture
def staged(logged_runs: tuple[str, str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A champion (version 1) and a candidate the register task staged as @challenger (version 2)."""
    connection, first, second = logged_runs
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", connection)
    name = f"apv_{uuid.uuid4().hex[:8]}"
    plain = load_config(write_config(tmp_path / "plain.yaml", name))
    config = load_config(write_config(tmp_path / "approval.yaml", name, APPROVAL))
    hook = MlflowHook()
    with hook.activated():
        register_candidate(hook, plain, first, gate_decision(), {}, log=LOG)
        decision = gate_decision(champion_version="1", candidate=0.85, champion=0.8, improvement=0.05)
        result = register_candidate(hook, config, second, decision, {}, log=LOG)
        yield hook, config, name, result, decision


def aliases(hook: MlflowHook, name: str) -> dict[str, str]:
    return {a: str(v) for a, v in hook.get_conn().get_registered_model(name).aliases.items()}
