from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import free_port

if TYPE_CHECKING:
    from airflow_trainpipe.runtime.tracking import Tracker


@pytest.fixture(scope="session")
def jobs_comm_op() -> None:
    """DeepSpeed's CPU communication op loaded in this process as a job's rank loads it
    (runtime/train.main's `load_comm_op`: from the folder of this interpreter's build layout).
    DeepSpeed keeps a loaded op, so an engine built here later finds it. Without this, the first
    engine built in this process compiled it again in the extensions root, which no job uses: the
    same build twice on a fresh machine (its ninja logs: 40 s for the first job, 31 s for
    test_speed's first engine; both commands hashed alike)."""
    from airflow_trainpipe.runtime.extensions import EXTENSIONS_ENV, load_comm_op

    root = os.environ.get(EXTENSIONS_ENV)
    try:
        load_comm_op()
    finally:  # it points this process's builds at the layout folder: later tests expect the root
        if root is None:
            os.environ.pop(EXTENSIONS_ENV, None)
        else:
            os.environ[EXTENSIONS_ENV] = root


@pytest.fixture(scope="module")
def one_rank_world() -> Iterator[None]:
    """This process is the whole job: a real gloo group of one rank, so collectives run for real."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


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
