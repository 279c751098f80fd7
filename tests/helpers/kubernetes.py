"""Kubernetes test helpers: no cluster here, so an API server address with nothing listening,
and the part of a task's context the Kubernetes launcher reads."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from tests.conftest import free_port

RUN_ID = "scheduled__2026-01-05T00:00:00+00:00"


def unreachable_kubeconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A kubeconfig whose API server address has nothing listening, set as the default connection."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "none",
                "clusters": [{"name": "none", "cluster": {"server": f"http://127.0.0.1:{free_port()}"}}],
                "contexts": [{"name": "none", "context": {"cluster": "none", "user": "none"}}],
                "users": [{"name": "none", "user": {}}],
            }
        )
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KUBERNETES_DEFAULT",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config_path": str(path)}}),
    )
    return str(path)


def task_context(try_number: int = 2) -> dict[str, Any]:
    ti = SimpleNamespace(dag_id="house_prices", task_id="train", try_number=try_number, map_index=-1)
    return {
        "ti": ti,
        "run_id": RUN_ID,
        "dag": SimpleNamespace(dag_id="house_prices"),
        "task_state_store": None,
    }
