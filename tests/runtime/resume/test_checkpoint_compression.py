"""`training.checkpoint.compression: zstd` in CheckpointManager: what is stored, verified, unpacked
and pruned. A real job killed and resumed with it is in test_resume.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from airflow_trainpipe.config.training import CheckpointSection
from airflow_trainpipe.runtime.resume.checkpoint import MARKER, CheckpointError, CheckpointManager, tag_for
from tests.runtime.resume.test_checkpoint import flaky  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("one_rank_world")  # complete_pending() and fetch() are collectives

# DeepSpeed's file names; contents with a compressible part, like torch.save's zip headers.
FILES = {
    "mp_rank_00_model_states.pt": bytes(50_000) + os.urandom(20_000),
    "zero_pp_rank_0_mp_rank_00_optim_states.pt": os.urandom(30_000) + bytes(90_000),
}
OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


class FakeEngine:
    """What save() needs of a DeepSpeed engine: a checkpoint's files written under <dir>/<tag>."""

    def save_checkpoint(
        self, save_dir: str, tag: str, client_state: dict[str, Any], save_latest: bool
    ) -> None:
        directory = Path(save_dir) / tag
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in FILES.items():
            (directory / name).write_bytes(data)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))  # where a local checkpoint is unpacked
    return tmp_path / "home"


def _manager(root: str, **cfg: Any) -> CheckpointManager:
    section = CheckpointSection(compression="zstd", keep_best=False, **cfg)
    return CheckpointManager(section, root, rank=0, local_rank=0, world_size=1, higher_is_better=True)


def _listing(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_zstd_checkpoint_holds_only_smaller_zst_files_and_unpacks_bit_exact(
    tmp_path: Path, home: Path
) -> None:
    manager = _manager(tmp_path.as_uri())
    manager.save(FakeEngine(), 10, {})
    stored = tmp_path / "checkpoints" / tag_for(10)
    assert sorted(p.name for p in stored.iterdir()) == sorted([MARKER, *(f"{name}.zst" for name in FILES)])
    marker = json.loads((stored / MARKER).read_text())
    assert marker["compression"] == "zstd"
    for name, data in FILES.items():
        meta = marker["files"][f"{name}.zst"]
        assert (
            meta["size"] == (stored / f"{name}.zst").stat().st_size < len(data) == meta["uncompressed_size"]
        )
    before = _listing(stored)

    directory, tag = manager.fetch(manager.latest_complete())
    assert (directory, tag) == (str(manager.unpacked), tag_for(10))
    assert manager.unpacked.is_relative_to(home)  # beside, never over, the verified files
    assert _listing(Path(directory) / tag) == FILES
    assert _listing(stored) == before


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_corrupt_zst_file_is_skipped_with_a_warning_naming_it(
    tmp_path: Path, home: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    manager = _manager(tmp_path.as_uri(), keep_last=3)
    manager.save(FakeEngine(), 10, {})
    manager.save(FakeEngine(), 20, {})
    shard = tmp_path / "checkpoints" / tag_for(20) / f"{OPTIM}.zst"
    data = bytearray(shard.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data) if damage == "flip" else bytes(data[:-10]))
    with caplog.at_level(logging.WARNING):
        assert manager.latest_complete().step == 10
    assert (
        f"skipping corrupt checkpoint {tmp_path.as_uri()}/checkpoints/{tag_for(20)}: {OPTIM}.zst"
        in caplog.text
    )


def test_a_decompression_that_disagrees_with_the_marker_fails_naming_the_checkpoint(
    tmp_path: Path, home: Path
) -> None:
    manager = _manager(tmp_path.as_uri())
    manager.save(FakeEngine(), 10, {})
    marker_file = tmp_path / "checkpoints" / tag_for(10) / MARKER
    marker = json.loads(marker_file.read_text())
    marker["files"][f"{OPTIM}.zst"]["uncompressed_size"] += 1  # the stored bytes still match their sha256
    marker_file.write_text(json.dumps(marker))
    with pytest.raises(
        CheckpointError, match=rf"cannot decompress {OPTIM}.zst of checkpoint .*{tag_for(10)}"
    ):
        manager.fetch(manager.latest_complete())


def test_a_checkpoint_from_before_compression_still_loads_in_place(tmp_path: Path, home: Path) -> None:
    old = _manager(tmp_path.as_uri())
    old.cfg = CheckpointSection(compression="none")
    old.save(FakeEngine(), 10, {})
    marker_file = tmp_path / "checkpoints" / tag_for(10) / MARKER
    marker = json.loads(marker_file.read_text())
    del marker["compression"]  # as markers were written before the field existed
    marker_file.write_text(json.dumps(marker))

    manager = _manager(tmp_path.as_uri())  # a retry whose config now says zstd
    checkpoint = manager.latest_complete()
    assert checkpoint.compression == "none"
    assert manager.fetch(checkpoint) == (str(tmp_path / "checkpoints"), tag_for(10))


def test_pruning_drops_the_unpacked_copies_too(tmp_path: Path, home: Path) -> None:
    manager = _manager(tmp_path.as_uri(), keep_last=1)
    manager.save(FakeEngine(), 10, {})
    directory, tag = manager.fetch(manager.latest_complete())
    assert (Path(directory) / tag).is_dir()
    manager.save(FakeEngine(), 20, {})
    assert not (Path(directory) / tag).exists()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [tag_for(20)]


@pytest.mark.usefixtures("flaky")
def test_a_remote_store_receives_only_zst_files(tmp_path: Path) -> None:
    run = tmp_path / "run"
    manager = _manager(f"flaky://{run}")
    (run / "checkpoints" / tag_for(10)).mkdir(parents=True)  # a local "store" has folders; S3 has none
    manager.save(FakeEngine(), 10, {})
    manager.complete_pending()  # an async save completes later
    stored = run / "checkpoints" / tag_for(10)
    assert sorted(p.name for p in stored.iterdir()) == sorted([MARKER, *(f"{name}.zst" for name in FILES)])
    assert _listing(manager.staging / tag_for(10)) == FILES  # the staged originals, no upload copies

    directory, tag = manager.fetch(manager.latest_complete())
    assert directory == str(manager.staging)
    assert _listing(Path(directory) / tag) == FILES
