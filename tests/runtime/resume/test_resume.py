"""Kill -9 a real 2-rank DeepSpeed job and resume it: bit-exact on the same world size,
within 1e-5 on another one (universal checkpoints), for ZeRO stages 1, 2 and 3.

Every job pays a process start (torchrun, DeepSpeed, MLflow), so stage 1 is one run killed three
times in a row: after a completed checkpoint, mid-step, and while a checkpoint is being saved.
Each try after a kill is checked against the uninterrupted run; the run directory the last kill
leaves is then copied for each way of finishing it (2 ranks, a corrupt newest checkpoint, 1 or
3 ranks)."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path

import mlflow
import pytest

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.runtime.data.prepare import PREPARED_FILE
from airflow_trainpipe.runtime.resume.checkpoint import (
    MARKER,
    CheckpointError,
    CompleteCheckpoint,
    data_identity,
    refuse_other_data,
    tag_for,
)
from airflow_trainpipe.runtime.tracking import RUN_ID_FILE
from tests.helpers.jobs import (
    EVERY_STEPS,
    Interrupted,
    JobRun,
    finished_after_the_kills,
    interrupted_run,
    job_config_text,
    make_spec,
    run_job,
    uninterrupted_run,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def interrupted(
    tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path, job_files: list[str]
) -> Interrupted:
    """Stage 1, killed -9 three times in a row (tests/helpers/jobs.py: once per session, the
    collectives test reads the same runs)."""
    return interrupted_run(tmp_path_factory, job_files)


def _assert_continues_bit_exact(
    resumed: JobRun, reference: JobRun, resumed_from: int, recomputed: int | None = None
) -> None:
    """A try that resumed: it starts right after `resumed_from` and repeats the reference's losses.
    It recomputes the steps the killed try ran past that checkpoint: exactly `recomputed`, or at
    most one checkpoint interval."""
    assert resumed.start is not None, resumed.text[-3000:]
    assert resumed.start["resumed_from"] == resumed_from
    if recomputed is None:
        assert 0 <= resumed.start["steps_recomputed"] <= EVERY_STEPS
    else:
        assert resumed.start["steps_recomputed"] == recomputed
    assert min(resumed.losses) == resumed_from + 1
    for step, loss in resumed.losses.items():
        assert loss == reference.losses[step], f"step {step}: {loss!r} != {reference.losses[step]!r}"


def _assert_resumed_bit_exact(
    resumed: JobRun, reference: JobRun, resumed_from: int, recomputed: int | None = None
) -> None:
    assert resumed.code == 0, resumed.text[-3000:]
    _assert_continues_bit_exact(resumed, reference, resumed_from, recomputed)
    assert resumed.result["resumed_from_step"] == resumed_from
    assert resumed.result["weights_sha256"] == reference.result["weights_sha256"]
    assert resumed.result["final_step"] == reference.result["final_step"]
    assert resumed.result["steps_recomputed"] == resumed.start["steps_recomputed"]


@pytest.mark.parametrize(
    ("resumed_try", "resumed_from", "synced_until"),
    [
        (1, 10, 20),  # try 1 was killed at step 13, after the step-10 checkpoint completed
        (2, 20, 30),  # try 2 was killed mid-step 22, between backward and optimizer step
    ],
    ids=["after_checkpoint", "mid_step"],
)
def test_kill_and_resume_is_bit_exact(
    interrupted: Interrupted, resumed_try: int, resumed_from: int, synced_until: int
) -> None:
    assert interrupted.tries[0].start["resumed_from"] == 0
    resumed = interrupted.tries[resumed_try]
    _assert_continues_bit_exact(resumed, interrupted.reference, resumed_from)
    # Losses are gathered every 10 steps: the try reported every step up to its last sync before its own kill.
    assert sorted(resumed.losses) == list(range(resumed_from + 1, synced_until + 1))


def test_kill_during_checkpoint_save_resumes_from_the_previous_one(
    interrupted: Interrupted, tmp_path_factory: pytest.TempPathFactory, job_files: list[str]
) -> None:
    # Try 4 on 2 ranks, run once per session (the collectives test reads it too).
    resumed, run_dir = finished_after_the_kills(tmp_path_factory, job_files)
    _assert_resumed_bit_exact(resumed, interrupted.reference, resumed_from=20)
    assert "reusing the fit of an earlier attempt" in resumed.text
    assert f"skipping partial checkpoint {run_dir}/checkpoints/step_000000030" in resumed.text


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(
    interrupted: Interrupted, tmp_path: Path
) -> None:
    damaged: list[str] = []

    def corrupt_step_20(run_dir: Path) -> None:
        shard = next((run_dir / "checkpoints" / "step_000000020").glob("*optim_states.pt"))
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0xFF
        shard.write_bytes(bytes(data))
        damaged.append(shard.name)

    resumed, run_dir = interrupted.resume(tmp_path, before=corrupt_step_20)
    assert (
        f"skipping corrupt checkpoint {run_dir}/checkpoints/step_000000020: {damaged[0]} sha256"
        in resumed.text
    )
    # Step 19 is the epoch-end checkpoint just before the damaged one; the killed try had run
    # steps 20 to 30.
    _assert_resumed_bit_exact(resumed, interrupted.reference, resumed_from=19, recomputed=11)


def test_the_run_id_on_other_data_is_refused_before_anything_is_trained_or_logged(
    interrupted: Interrupted, tmp_path: Path
) -> None:
    """`trainpipe train --run-id d1 --ds <another day>` went on from day 1's checkpoint on day 2's
    rows and wrote day 2's digest and spec into day 1's (registered) MLflow run."""
    other_day = write_day((tmp_path / "data").as_uri(), date(2026, 1, 2), 1200, seed=9)
    refused, run_dir = interrupted.resume(tmp_path / "run", nproc=1, files=other_day)
    assert refused.code != 0 and refused.start is None and refused.result is None, refused.text[-3000:]
    error = next(line for line in refused.text.splitlines() if '"event": "error"' in line)
    assert f"run directory {run_dir} holds checkpoints of this run id trained on data files:" in error
    assert '"retryable": false' in error
    marker = json.loads((local_path(run_dir) / "checkpoints" / tag_for(20) / MARKER).read_text())
    assert marker["data"] == data_identity(interrupted.files)


def test_a_marker_without_its_data_is_resumed_as_it_is() -> None:
    """Checkpoints saved before markers named their data resume on the data the job is given."""
    old = CompleteCheckpoint("step_000000010", "file:///run/checkpoints/step_000000010", {"step": 10})
    refuse_other_data(old, "files:abc", "file:///run")
    with pytest.raises(CheckpointError, match="trained on data files:abc, and this job reads files:def"):
        refuse_other_data(CompleteCheckpoint(old.tag, old.uri, {"data": "files:abc"}), "files:def", "x")


@pytest.mark.parametrize("world_size", [1, 3])
def test_two_rank_checkpoint_resumes_on_another_world_size(
    interrupted: Interrupted, tmp_path: Path, world_size: int
) -> None:
    # Without the run's saved fit, this world size fits again: to the very same transform.
    resumed, _ = interrupted.resume(
        tmp_path, nproc=world_size, before=lambda run_dir: (run_dir / PREPARED_FILE).unlink()
    )
    assert resumed.code == 0, resumed.text[-3000:]
    assert resumed.result["world_size"] == world_size and resumed.result["resumed_from_step"] == 20
    assert resumed.result["transform_hash"] == interrupted.reference.result["transform_hash"]
    assert resumed.start["fit_s"] > 0 and "reusing the fit" not in resumed.text
    for step, loss in resumed.losses.items():
        assert loss == pytest.approx(interrupted.reference.losses[step], abs=1e-5), f"step {step}"
    assert resumed.result["final_step"] == interrupted.reference.result["final_step"]


# Stage 2 is the zstd test's below: its checkpoint has stage 1's files, and what is checked here
# is checked there too.
@pytest.mark.parametrize("zero_stage", [3])
def test_zero_stage_trains_and_resumes_bit_exact(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    trainpipe_home: Path,
    job_files: list[str],
    zero_stage: int,
) -> None:
    # Stage 1 is the stage of every test above. A ZeRO stage only lays the state out across the
    # ranks, not the arithmetic (on 2 gloo ranks, stages 1, 2 and 3 train bit for bit alike), so
    # stage 1's uninterrupted run is the reference of this stage's killed and resumed job too.
    reference = uninterrupted_run(tmp_path_factory, job_files, zero_stage=1)
    spec = make_spec(tmp_path, job_files, f"zero{zero_stage}", zero_stage)
    assert spec.config.training.deepspeed.zero_stage == zero_stage
    killed = _killed_as_stage_one_trained(spec, reference)
    resumed = run_job(spec)
    _assert_resumed_bit_exact(resumed, reference, resumed_from=10)
    assert resumed.result is not None
    assert resumed.losses[resumed.result["final_step"]] < killed.losses[1]  # it learns
    _assert_stage_ran(resumed, trainpipe_home, zero_stage)


def _killed_as_stage_one_trained(spec: TrainSpec, reference: JobRun) -> JobRun:
    """The job killed at step 13; until then (losses are gathered every 10 steps) it trained as
    stage 1's uninterrupted reference did, bit for bit."""
    killed = run_job(spec, pause_at="step:13")
    assert killed.code != 0
    assert sorted(killed.losses) == list(range(1, EVERY_STEPS + 1)), killed.text[-3000:]
    for step, loss in killed.losses.items():
        assert loss == reference.losses[step], f"step {step}: {loss!r} != {reference.losses[step]!r}"
    return killed


def _assert_stage_ran(run: JobRun, trainpipe_home: Path, zero_stage: int) -> None:
    """DeepSpeed was given the stage, and ZeRO-3 (only) built the model partitioned."""
    assert run.result is not None
    client = mlflow.MlflowClient(f"sqlite:///{trainpipe_home / 'mlflow.db'}")
    params = client.get_run(run.result["mlflow_run_id"]).data.params
    assert params["deepspeed_config.zero_optimization.stage"] == str(zero_stage)
    built = next(line for line in run.output if "model built:" in line)
    assert ("partitioned as built" in built) == (zero_stage == 3), built


ZSTD_STAGE = 2  # ZeRO-2's kill and bit-exact resume too (test_zero_stage_trains_and_resumes_bit_exact)


def _zstd_spec(root: Path, files: list[str]) -> TrainSpec:
    text = job_config_text(root, zero_stage=ZSTD_STAGE).replace(
        "    async: true\n", "    async: true\n    compression: zstd\n"
    )
    return TrainSpec(config=parse_config(text), run_id="zstd", data_files=files)


def test_a_zstd_checkpoint_is_stored_compressed_and_resumes_bit_exact_on_any_world_size(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path, job_files: list[str]
) -> None:
    # The uncompressed stage-1 reference: compression must change nothing but the bytes on disk,
    # and a ZeRO stage nothing but the state's layout across the ranks.
    reference = uninterrupted_run(tmp_path_factory, job_files, zero_stage=1)
    spec = _zstd_spec(tmp_path / "two_ranks", job_files)
    assert spec.config.training.deepspeed.zero_stage == ZSTD_STAGE
    _killed_as_stage_one_trained(spec, reference)
    stored = local_path(spec.run_dir) / "checkpoints" / tag_for(10)
    marker = json.loads((stored / MARKER).read_text())
    assert marker["compression"] == "zstd" and all(name.endswith(".zst") for name in marker["files"])
    assert sorted(p.name for p in stored.iterdir()) == sorted([MARKER, *marker["files"]])
    for name, meta in marker["files"].items():
        assert (stored / name).stat().st_size == meta["size"] < meta["uncompressed_size"], name

    # Another world size first, on a copy: it converts the unpacked checkpoint to a universal one.
    other = _zstd_spec(tmp_path / "one_rank", job_files)
    shutil.copytree(local_path(spec.run_dir), local_path(other.run_dir))
    (local_path(other.run_dir) / RUN_ID_FILE).unlink()
    # One rank forked from the warm parent, as a one-rank CPU job runs: the ranks that matter here
    # are the two (torchrun's) that wrote the compressed checkpoint this one rank unpacks.
    one_rank = run_job(other, nproc=1, forked=True)
    assert one_rank.code == 0, one_rank.text[-3000:]
    assert (one_rank.result["world_size"], one_rank.result["resumed_from_step"]) == (1, 10)
    for step, loss in one_rank.losses.items():
        assert loss == pytest.approx(reference.losses[step], abs=1e-5), f"step {step}"

    resumed = run_job(spec)
    _assert_resumed_bit_exact(resumed, reference, resumed_from=10)
    _assert_stage_ran(resumed, trainpipe_home, ZSTD_STAGE)
