"""`trainpipe pools`: the pools the configs' training tasks need, and `--apply` on a real metadata DB."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from airflow_trainpipe.cli import main
from tests.conftest import EXAMPLE_CONFIGS


def test_the_example_configs_need_a_ranks_pool_and_a_gpus_pool(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(6)))
    assert main(["pools", str(EXAMPLE_CONFIGS)]) == 0
    out = capsys.readouterr().out
    # Local 2-rank jobs: the host's 6 cores. house_prices' 2 pods x 4 GPUs: its own pool.
    assert "trainpipe_training: 6 slot(s), largest job 2: fraud_detector.train," in out
    assert "fraud_detector_tuned.trial" in out
    assert "trainpipe_kubernetes: 8 slot(s), largest job 8: house_prices.train\n" in out
    assert "airflow pools set trainpipe_training 6 'trainpipe: one slot per rank" in out


def test_a_pool_below_the_largest_job_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pools", str(EXAMPLE_CONFIGS / "fraud_detector.yaml"), "--slots", "1"]) == 1
    err = capsys.readouterr().err
    assert "trainpipe_training: --slots 1 is below its largest job (2 slots), which would never start" in err


def _pools(db: Path) -> dict[str, tuple[int, bool]]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT pool, slots, include_deferred FROM slot_pool").fetchall()
    return {name: (slots, bool(deferred)) for name, slots, deferred in rows}


def test_apply_creates_the_pools_grows_a_small_one_and_keeps_one_an_operator_sized(
    tmp_path: Path, migrated_airflow_db: Path
) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    shutil.copy2(migrated_airflow_db, home / "airflow.db")
    env = {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    trainpipe = [str(Path(sys.executable).parent / "trainpipe"), "pools", str(EXAMPLE_CONFIGS)]

    def apply(*extra: str) -> str:
        done = subprocess.run(
            [*trainpipe, "--apply", *extra], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    cores = len(os.sched_getaffinity(0))
    out = apply()
    assert f"trainpipe_training: created to {max(2, cores)} slot(s)" in out
    assert _pools(home / "airflow.db")["trainpipe_kubernetes"] == (8, True)  # a waiting job keeps its GPUs
    with sqlite3.connect(home / "airflow.db") as connection:  # an operator's own sizes
        connection.execute("UPDATE slot_pool SET slots = 1 WHERE pool = 'trainpipe_training'")
        connection.execute("UPDATE slot_pool SET slots = 32 WHERE pool = 'trainpipe_kubernetes'")
    out = apply()
    assert f"trainpipe_training: resized from 1 to {max(2, cores)} slot(s) (largest job 2)" in out
    assert "trainpipe_kubernetes: kept at 32 slot(s) (largest job 8)" in out
    apply("--slots", "12")  # an explicit size is the operator's word
    assert _pools(home / "airflow.db") | {"default_pool": (0, False)} == {
        "default_pool": (0, False),
        "trainpipe_training": (12, True),
        "trainpipe_kubernetes": (12, True),
    }
