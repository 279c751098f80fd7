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
    """A kubeconfig whose API server address has nothing listening, set as the default connection.

    Each API call is still tried as often as the provider tries it ([workers] api_retries, 5),
    but with 10-50 ms between tries instead of the provider's back-off (1, 2, 4, 8 s): with nothing
    listening, every try is refused at once, and the back-off was 15 s of a test spent asleep.
    """
    import tenacity
    from airflow.providers.cncf.kubernetes import kubernetes_helper_functions

    # Read at call time by the provider's retry (WaitRetryAfterOrExponential), set at import
    # from [workers] api_retry_wait_min/max: changing the options now would not reach it.
    monkeypatch.setattr(
        kubernetes_helper_functions, "_default_wait", tenacity.wait_exponential(min=0.01, max=0.05)
    )
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
