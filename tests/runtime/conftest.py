from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from airflow_trainpipe.runtime.tracking import Tracker


@pytest.fixture
def tracker(
    tmp_path: Path, trainpipe_home: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> Tracker:
    """A Tracker (rank 0's MLflow run) on the session's embedded store, one run per test."""
    from airflow_trainpipe.runtime.tracking import Tracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "")  # the session's embedded store; set_tracking_uri is undone
    experiment = request.module.__name__.rsplit(".", 1)[-1]
    return Tracker(
        experiment=experiment, run_dir=tmp_path.as_uri(), run_name=request.node.name, run_id=None, tags={}
    )
