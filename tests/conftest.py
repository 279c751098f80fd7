from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIGS = REPO_ROOT / "dags" / "configs"


@pytest.fixture(autouse=True, scope="session")
def _isolated_airflow_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep Airflow's state (airflow.cfg, SQLite DB, logs) out of the user's ~/airflow.
    home = tmp_path_factory.mktemp("airflow_home")
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
