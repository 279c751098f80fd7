from __future__ import annotations

import os
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.synthetic import write_day

REPO_ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIGS = REPO_ROOT / "dags" / "configs"


@pytest.fixture(autouse=True, scope="session")
def _isolated_airflow_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Keep Airflow's state (airflow.cfg, SQLite DB, logs) out of the user's ~/airflow.
    home = tmp_path_factory.mktemp("airflow_home")
    os.environ.setdefault("AIRFLOW_HOME", str(home))
    os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")


@pytest.fixture(scope="session")
def trainpipe_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("trainpipe_home")
    os.environ["TRAINPIPE_HOME"] = str(home)  # inherited by every job: one MLflow database
    return home


@pytest.fixture(scope="session")
def job_files(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return write_day(tmp_path_factory.mktemp("data").as_uri(), date(2026, 1, 1), 1200, seed=5)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory):
    """A real `mlflow server` (basic auth, sqlite, local artifacts) on 127.0.0.1 for the session."""
    from tests.mlflow_server import start_mlflow_server, stop_mlflow_server

    server = start_mlflow_server(tmp_path_factory.mktemp("mlflow_server"))
    yield server
    stop_mlflow_server(server.process)
