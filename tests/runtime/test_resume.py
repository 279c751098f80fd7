"""Kill -9 a real 2-rank DeepSpeed job and resume it: bit-exact on the same world size,
within 1e-5 on another one (universal checkpoints), for ZeRO stages 1, 2 and 3."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.jobs import EVERY_STEPS, JobRun, make_spec, run_job

pytestmark = pytest.mark.slow

_baselines: dict[int, JobRun] = {}


def baseline(tmp_path_factory: pytest.TempPathFactory, files: list[str], zero_stage: int) -> JobRun:
    """One uninterrupted run per ZeRO stage, shared by the tests of that stage."""
    if zero_stage not in _baselines:
        root = tmp_path_factory.mktemp(f"baseline_zero{zero_stage}")
        run = run_job(make_spec(root, files, "uninterrupted", zero_stage))
        assert run.code == 0, run.text[-3000:]
        _baselines[zero_stage] = run
    return _baselines[zero_stage]


def _assert_resumed_bit_exact(resumed: JobRun, reference: JobRun, resumed_from: int) -> None:
    assert resumed.code == 0, resumed.text[-3000:]
    assert resumed.result["resumed_from_step"] == resumed_from
    assert min(resumed.losses) == resumed_from + 1
    for step, loss in resumed.losses.items():
        assert loss == reference.losses[step], f"step {step}: {loss!r} != {reference.losses[step]!r}"
    assert resumed.result["weights_sha256"] == reference.result["weights_sha256"]
    assert resumed.result["final_step"] == reference.result["final_step"]
    assert 0 <= resumed.result["steps_recomputed"] <= EVERY_STEPS


@pytest.mark.parametrize(
    ("kill_at", "resumed_from"),
    [
        ("step:13", 10),      # after the step-10 checkpoint completed
        ("mid_step:17", 10),  # between backward and optimizer step
        ("save:30", 20),      # step 30's files written, its completion marker not yet
    ],
    ids=["after_checkpoint", "mid_step", "during_checkpoint_save"],
)
def test_kill_and_resume_is_bit_exact(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path,
                                      job_files: list[str], kill_at: str, resumed_from: int) -> None:
    reference = baseline(tmp_path_factory, job_files, zero_stage=1)
    spec = make_spec(tmp_path, job_files, "killed")
    killed = run_job(spec, pause_at=kill_at)
    assert killed.code != 0 and killed.result is None
    resumed = run_job(spec)
    _assert_resumed_bit_exact(resumed, reference, resumed_from)
    if kill_at.startswith("save:"):
        assert f"skipping partial checkpoint {spec.run_dir}/checkpoints/step_000000030" in resumed.text


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                                  trainpipe_home: Path, job_files: list[str]) -> None:
    reference = baseline(tmp_path_factory, job_files, zero_stage=1)
    spec = make_spec(tmp_path, job_files, "corrupted")
    assert run_job(spec, pause_at="step:23").code != 0
    shard = next((tmp_path / "fraud_detector" / "corrupted" / "checkpoints" / "step_000000020").glob("*optim_states.pt"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    resumed = run_job(spec)
    assert f"skipping corrupt checkpoint {spec.run_dir}/checkpoints/step_000000020: {shard.name} sha256" in resumed.text
    # Step 19 is the epoch-end checkpoint just before the damaged one.
    _assert_resumed_bit_exact(resumed, reference, resumed_from=19)


@pytest.mark.parametrize("world_size", [1, 3])
def test_two_rank_checkpoint_resumes_on_another_world_size(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                           trainpipe_home: Path, job_files: list[str], world_size: int) -> None:
    reference = baseline(tmp_path_factory, job_files, zero_stage=1)
    spec = make_spec(tmp_path, job_files, f"elastic{world_size}")
    assert run_job(spec, pause_at="step:25").code != 0
    resumed = run_job(spec, nproc=world_size)
    assert resumed.code == 0, resumed.text[-3000:]
    assert resumed.result["world_size"] == world_size and resumed.result["resumed_from_step"] == 20
    for step, loss in resumed.losses.items():
        assert loss == pytest.approx(reference.losses[step], abs=1e-5), f"step {step}"
    assert resumed.result["final_step"] == reference.result["final_step"]


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_zero_stage_trains_and_resumes_bit_exact(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                 trainpipe_home: Path, job_files: list[str], zero_stage: int) -> None:
    # Stage 1 is the stage of every test above.
    reference = baseline(tmp_path_factory, job_files, zero_stage)
    assert reference.losses[reference.result["final_step"]] < reference.losses[1]  # it learns
    spec = make_spec(tmp_path, job_files, f"zero{zero_stage}", zero_stage)
    assert run_job(spec, pause_at="step:13").code != 0
    _assert_resumed_bit_exact(run_job(spec), reference, resumed_from=10)
