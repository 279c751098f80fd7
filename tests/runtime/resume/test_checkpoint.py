"""Which checkpoint a retry resumes from; the process-level tests are in test_resume.py."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import fsspec
import pytest
from fsspec.implementations.local import LocalFileSystem

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.runtime.resume.checkpoint import (
    MARKER,
    CheckpointError,
    CheckpointManager,
    _PendingSave,
    tag_for,
)


def _manager(tmp_path: Path) -> CheckpointManager:
    return CheckpointManager(
        CheckpointSection(), tmp_path.as_uri(), rank=0, local_rank=0, world_size=2, higher_is_better=True
    )


def _write(root: Path, step: int, *, complete: bool = True) -> Path:
    directory = root / "checkpoints" / tag_for(step)
    directory.mkdir(parents=True)
    (directory / "mp_rank_00_model_states.pt").write_bytes(f"weights {step}".encode())
    if complete:
        files = {
            p.name: {"size": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
            for p in directory.iterdir()
        }
        (directory / MARKER).write_text(json.dumps({"step": step, "world_size": 2, "files": files}))
    return directory


def test_newest_complete_checkpoint_wins(tmp_path: Path) -> None:
    _write(tmp_path, 10)
    _write(tmp_path, 20)
    assert _manager(tmp_path).latest_complete().step == 20


def test_partial_checkpoint_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(tmp_path, 10)
    _write(tmp_path, 20, complete=False)
    with caplog.at_level(logging.WARNING):
        assert _manager(tmp_path).latest_complete().step == 10
    assert f"skipping partial checkpoint {tmp_path.as_uri()}/checkpoints/step_000000020" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete"])
def test_corrupt_checkpoint_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
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
    assert (
        f"skipping corrupt checkpoint {tmp_path.as_uri()}/checkpoints/step_000000020: mp_rank_00_model_states.pt"
        in caplog.text
    )


def test_no_checkpoint_means_a_fresh_start(tmp_path: Path) -> None:
    assert _manager(tmp_path).latest_complete() is None


def test_due_by_steps_and_minutes(tmp_path: Path) -> None:
    manager = CheckpointManager(
        CheckpointSection(every_steps=5, every_minutes=0.0001),
        tmp_path.as_uri(),
        rank=0,
        local_rank=0,
        world_size=1,
        higher_is_better=True,
    )
    assert manager.due(5)
    import time

    time.sleep(0.01)
    assert manager.due(3)  # the time interval elapsed


# -- reads that fail ---------------------------------------------------------------------------
# A remote-like store: the local filesystem behind a protocol of its own (so the manager treats it
# as remote, staging and uploading), whose reads of chosen files fail like a network blip.


class FlakyFileSystem(LocalFileSystem):
    protocol = "flaky"
    failures: dict[str, int] = {}  # "<folder>/<file>" -> reads still to fail (-1: every read)
    root_marker = "/"

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(path.removeprefix("flaky://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        name = "/".join(str(path).rsplit("/", 2)[-2:])
        left = self.failures.get(name, 0)
        if left:
            self.failures[name] = left - 1 if left > 0 else left
            raise ConnectionError(f"simulated network error reading {path}")
        return super().cat_file(path, start=start, end=end, **kwargs)


fsspec.register_implementation("flaky", FlakyFileSystem, clobber=True)


@pytest.fixture
def flaky(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))  # staging of the "remote" store
    monkeypatch.setattr("airflow_trainpipe.runtime.resume.checkpoint.READ_BACKOFF_S", 0.01, raising=False)
    FlakyFileSystem.failures = {}
    return FlakyFileSystem.failures


def _complete_save(manager: CheckpointManager, run: Path, step: int, metric: float) -> None:
    """What save() leaves for complete_pending(): this rank's files on the store, hashed.
    complete_pending() is a collective: its tests run in `one_rank_world` (tests/runtime/conftest.py)."""
    (run / "checkpoints" / tag_for(step)).mkdir(parents=True)
    (run / "checkpoints" / tag_for(step) / "weights.pt").write_bytes(b"w")
    manager._pending = _PendingSave(tag_for(step), step, metric, {})
    manager.complete_pending()


def _flaky_manager(run: Path, keep_last: int = 2) -> CheckpointManager:
    cfg = CheckpointSection(keep_last=keep_last, keep_best=True)
    return CheckpointManager(cfg, f"flaky://{run}", rank=0, local_rank=0, world_size=1, higher_is_better=True)


def _steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


def test_a_transient_marker_read_failure_is_retried_and_prunes_only_what_it_should(
    tmp_path: Path, flaky, one_rank_world
) -> None:
    run = tmp_path / "run"
    manager = _flaky_manager(run, keep_last=3)
    for step, metric in ((10, 0.9), (20, 0.5), (30, 0.6)):
        _complete_save(manager, run, step, metric)
    # The marker of step 20 and best.json fail twice each while step 40 completes. Read as "no
    # marker", step 20 looked partial and was deleted, and best.json was overwritten with step 40.
    flaky.update({f"{tag_for(20)}/{MARKER}": 2, "checkpoints/best.json": 2})
    _complete_save(manager, run, 40, 0.7)
    # keep_last 3 (40, 30, 20) + best (10): nothing pruned, best.json still names step 10.
    assert _steps(run) == [tag_for(s) for s in (10, 20, 30, 40)]
    assert json.loads((run / "checkpoints" / "best.json").read_text())["tag"] == tag_for(10)
    _complete_save(manager, run, 50, 0.8)  # and pruning still works: 20 goes, best 10 stays
    assert _steps(run) == [tag_for(s) for s in (10, 30, 40, 50)]


def test_a_marker_that_stays_unreadable_fails_loudly_and_deletes_nothing(
    tmp_path: Path, flaky, one_rank_world
) -> None:
    run = tmp_path / "run"
    manager = _flaky_manager(run)
    for step, metric in ((10, 0.9), (20, 0.5), (30, 0.6)):
        _complete_save(manager, run, step, metric)
    flaky[f"{tag_for(20)}/{MARKER}"] = -1
    with pytest.raises(
        CheckpointError, match=rf"cannot read flaky://{run}/checkpoints/{tag_for(20)}/{MARKER} \(4 attempts\)"
    ):
        _complete_save(manager, run, 40, 0.95)
    assert _steps(run) == [tag_for(s) for s in (10, 20, 30, 40)]
    flaky[f"{tag_for(40)}/{MARKER}"] = -1
    with pytest.raises(
        CheckpointError, match=tag_for(40)
    ):  # a resume does not fall back to an older checkpoint either
        manager.latest_complete()
    flaky.clear()
    assert manager.latest_complete().step == 40


def test_an_unreadable_best_json_is_never_overwritten(tmp_path: Path, flaky, one_rank_world) -> None:
    run = tmp_path / "run"
    manager = _flaky_manager(run)
    _complete_save(manager, run, 10, 0.9)
    flaky["checkpoints/best.json"] = -1
    with pytest.raises(CheckpointError, match=r"best.json"):
        _complete_save(manager, run, 20, 0.1)  # worse: best.json must keep naming step 10
    assert json.loads((run / "checkpoints" / "best.json").read_text())["tag"] == tag_for(10)


def test_a_best_checkpoint_that_is_partial_is_named_not_loaded(tmp_path: Path) -> None:
    # training.restore_best loads the best epoch's checkpoint by step: a missing marker is an error
    # naming the checkpoint, never a load of half a checkpoint.
    _write(tmp_path, 10)
    _write(tmp_path, 20, complete=False)
    assert _manager(tmp_path).complete_at(10).step == 10
    with pytest.raises(
        CheckpointError, match=rf"partial checkpoint {tmp_path.as_uri()}/checkpoints/step_000000020"
    ):
        _manager(tmp_path).complete_at(20)


def test_a_checkpoint_resumes_only_into_the_parameters_it_was_saved_by() -> None:
    """training.speed.fused_qkv keeps the model states' names but not the optimizer's layout: a
    resume with the lever flipped would load the optimizer's flat copies into the wrong tensors."""
    import torch
    from transformers import BertConfig, BertModel

    from airflow_trainpipe.runtime.models.fused_qkv import fuse_qkv
    from airflow_trainpipe.runtime.resume.checkpoint import (
        CompleteCheckpoint,
        parameter_layout,
        refuse_other_layout,
    )

    def encoder() -> torch.nn.Module:
        config = BertConfig(
            vocab_size=20, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
        )
        return BertModel(config, add_pooling_layer=False)

    plain, fused = encoder(), encoder()
    fuse_qkv(fused)
    assert list(plain.state_dict()) == list(fused.state_dict())  # the model states cannot tell them apart
    saved = CompleteCheckpoint(
        "step_000000010", "file:///c/step_000000010", {"parameter_layout": parameter_layout(plain)}
    )
    refuse_other_layout(saved, parameter_layout(encoder()))  # the same layout resumes
    refuse_other_layout(
        CompleteCheckpoint("step_000000010", "file:///c/step_000000010", {}), "sha256:x"
    )  # older markers
    with pytest.raises(CheckpointError, match="laid out otherwise") as caught:
        refuse_other_layout(saved, parameter_layout(fused))
    assert "file:///c/step_000000010" in str(caught.value) and not caught.value.retryable
