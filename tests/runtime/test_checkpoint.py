"""Which checkpoint a retry resumes from; the process-level tests are in test_resume.py."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import pytest

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.runtime.checkpoint import MARKER, CheckpointManager, tag_for


def _manager(tmp_path: Path) -> CheckpointManager:
    return CheckpointManager(CheckpointSection(), tmp_path.as_uri(), rank=0, local_rank=0, world_size=2, higher_is_better=True)


def _write(root: Path, step: int, *, complete: bool = True) -> Path:
    directory = root / "checkpoints" / tag_for(step)
    directory.mkdir(parents=True)
    (directory / "mp_rank_00_model_states.pt").write_bytes(f"weights {step}".encode())
    if complete:
        files = {p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in directory.iterdir()}
        (directory / MARKER).write_text(json.dumps({"step": step, "world_size": 2, "files": files}))
    return directory


def test_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    _write(tmp_path, 10)
    _write(tmp_path, 20)
    assert _manager(tmp_path).latest_complete().step == 20


def test_partial_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _write(tmp_path, 10)
    _write(tmp_path, 20, complete=False)
    with caplog.at_level(logging.WARNING):
        assert _manager(tmp_path).latest_complete().step == 10
    assert f"skipping partial checkpoint {tmp_path.as_uri()}/checkpoints/step_000000020" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_checkpoint_is_skipped_with_a_warning_naming_it(tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str) -> None:
    _write(tmp_path, 10)
    weights = _write(tmp_path, 20) / "mp_rank_00_model_states.pt"
    if damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-1])
    elif damage == "flip":
        data = bytearray(weights.read_bytes())
        data[0] ^= 1
        weights.write_bytes(bytes(data))
    else:
        weights.unlink()
    with caplog.at_level(logging.WARNING):
        assert _manager(tmp_path).latest_complete().step == 10
    assert f"skipping corrupt checkpoint {tmp_path.as_uri()}/checkpoints/step_000000020: mp_rank_00_model_states.pt" in caplog.text


def test_no_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    assert _manager(tmp_path).latest_complete() is None


def test_due_by_steps_and_minutes(tmp_path: Path) -> None:
    manager = CheckpointManager(CheckpointSection(every_steps=5, every_minutes=0.0001), tmp_path.as_uri(), rank=0, local_rank=0, world_size=1, higher_is_better=True)
    assert manager.due(5)
    import time

    time.sleep(0.01)
    assert manager.due(3)  # the time interval elapsed
