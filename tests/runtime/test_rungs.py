"""runtime.rungs: a tuning trial's rungs inside its one training job, on a real study.

Each case runs the real job (torchrun's 2 gloo ranks, or one rank forked from the warm parent as
`trainpipe tune` runs a CPU trial) against an Optuna study in an SQLite file,
seeded with earlier trials whose rung values decide what successive halving says: a trial behind
them is pruned at the rung and its job ends cleanly, a trial ahead goes on to its full budget.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import psutil
import pytest
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.runtime.rungs import STORAGE_ENV, pruner
from airflow_trainpipe.tuning.outcomes import StudyRef
from airflow_trainpipe.tuning.trials import rung_spec
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.jobs import run_job, warm_parents

EPOCHS = 3


def _base(root: Path, files: list[str]) -> TrainSpec:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text())
    # A decaying rate: a trial's schedule spans its full budget, so the job trained to the first
    # rung alone follows the same curve as the trial (what the survivor test compares).
    config["training"]["hyperparameters"].update(batch_size=32, epochs=EPOCHS, lr_schedule="linear")
    config["training"]["checkpoint"].update(uri=root.as_uri(), every_steps=5, keep_last=2)
    return TrainSpec(config=parse_config(yaml.safe_dump(config)), run_id="study", data_files=files)


def _study(folder: Path, base: TrainSpec, earlier: float) -> tuple[optuna.Study, str]:
    """A study whose three earlier trials reported `earlier` at the first rung and completed."""
    url = f"sqlite:///{folder / 'study.db'}"
    study = optuna.create_study(
        study_name="rungs", storage=url, direction="maximize", pruner=pruner(base.config)
    )
    for _ in range(3):
        done = study.ask()
        done.report(earlier, 1)
        done.should_prune()  # successive halving ranks a rung among the trials that asked at it
        study.tell(done, earlier)
    return study, url


def _trial_spec(base: TrainSpec, study: optuna.Study, **kwargs: object) -> tuple[TrainSpec, optuna.Trial]:
    assert base.config.tuning is not None
    trial = study.ask()
    ref = StudyRef(study_name=study.study_name, storage="", parent_run_id="", run_id="study")
    spec = rung_spec(
        base, ref, trial.number, base.hyperparameters, base.config.tuning, EPOCHS, True,
        rungs=[1], trial_id=trial._trial_id, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    return spec, trial


def _trial_job(
    tmp_path: Path, files: list[str], earlier: float
) -> tuple[TrainSpec, optuna.Study, str, TrainSpec, optuna.Trial]:
    """(base spec, study seeded with `earlier`, its URL, the new trial's spec, the trial)."""
    base = _base(tmp_path / "checkpoints", files)
    study, url = _study(tmp_path, base, earlier)
    spec, trial = _trial_spec(base, study)
    return base, study, url, spec, trial


def _no_job_left() -> None:
    """No training process is alive under this one (an exited child an earlier test left
    unreaped, a zombie, trains nothing). A warm parent is not a job, whoever started it (this
    process, or a dag.test() worker an earlier test left for the next); a job forked from it is."""
    jobs = []
    parents = {p.pid for p in warm_parents(recursive=True)}
    for process in psutil.Process().children(recursive=True):
        try:
            if (
                "airflow_trainpipe.runtime.train" in " ".join(process.cmdline())
                and process.pid not in parents
            ):
                jobs.append(process)
        except (psutil.ZombieProcess, psutil.NoSuchProcess):
            continue
    assert jobs == []


def test_a_trial_behind_the_others_is_pruned_and_its_job_ends_cleanly(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    _, study, url, spec, trial = _trial_job(tmp_path, job_files, earlier=0.999)
    run = run_job(spec, env={STORAGE_ENV: url})
    assert run.code == 0, run.text[-3000:]
    _no_job_left()  # torchrun and both ranks exited: nothing trains on after the decision
    result = run.result
    assert result is not None
    assert result["pruned"] is True and result["epochs_completed"] == 1
    (rung,) = result["rungs"]
    assert rung["resource"] == 1 and rung["value"] == result["holdout_metrics"]["roc_auc"]
    assert result["model_uri"] is None and result["evaluation"] is None  # a pruned trial publishes nothing
    stored = study._storage.get_trial(trial._trial_id)
    assert stored.intermediate_values == {1: rung["value"]}
    assert stored.state == optuna.trial.TrialState.RUNNING  # the task tells the study how it ended
    # Start-up is device time too, and the result says where it went.
    assert 0 < result["startup_compute_hours"] < result["compute_hours_cpu"]
    assert {"interpreter_and_imports", "engine", "tracking"} <= set(result["timing"]["startup"])
    # Asking the study is timed apart: the full-budget estimate leaves it out.
    assert 0 < result["timing"]["study_s"] < result["timing"]["loop_s"]


def test_a_survivor_equals_a_trial_trained_in_one_go_and_its_rung_value_is_a_short_jobs(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    # One rank forked from the warm parent, as `trainpipe tune` runs a CPU trial: what is compared
    # here is the training, not the ranks (the pruned case above keeps torchrun's 2 ranks).
    base, study, url, spec, trial = _trial_job(tmp_path, job_files, earlier=0.01)
    survivor = run_job(spec, 1, env={STORAGE_ENV: url}, forked=True)
    assert survivor.code == 0, survivor.text[-3000:]
    assert survivor.result is not None and survivor.result["pruned"] is False
    assert survivor.result["epochs_completed"] == EPOCHS and survivor.result["model_uri"]
    assert study._storage.get_trial(trial._trial_id).intermediate_values == {
        1: survivor.result["rungs"][0]["value"]
    }

    assert base.config.tuning is not None
    ref = StudyRef(study_name="rungs", storage="", parent_run_id="", run_id="study")
    tuning, hp = base.config.tuning, base.hyperparameters
    one_go = run_job(
        rung_spec(base, ref, trial.number, hp, tuning, EPOCHS, True, label="one-go"), 1, forked=True
    )
    short = run_job(
        rung_spec(base, ref, trial.number, hp, tuning, 1, False, label="one-epoch"), 1, forked=True
    )
    assert one_go.result is not None and short.result is not None
    # Asking the study at the rung changed nothing in the training: the same weights.
    assert survivor.result["weights_sha256"] == one_go.result["weights_sha256"]
    # The value the pruner saw is what a job trained to the rung alone scores.
    assert survivor.result["rungs"][0]["value"] == short.result["holdout_metrics"]["roc_auc"]


def test_a_trial_job_without_its_study_storage_stops_before_training_on(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    *_, spec, _ = _trial_job(tmp_path, job_files, earlier=0.5)
    # One rank forked from the warm parent, as `trainpipe tune` runs a CPU trial: the subject is
    # the trial's check of its environment before it trains, not the ranks.
    run = run_job(spec, nproc=1, forked=True)
    assert run.code != 0
    assert f"{STORAGE_ENV} is not set" in run.text and "StudyUnreachable" in run.text
    assert "epoch 1 done" not in run.text
    _no_job_left()


@pytest.mark.parametrize("ends", [[2, 1], [1, 1]])
def test_rungs_must_increase_and_name_their_study(ends: list[int]) -> None:
    from pydantic import ValidationError

    from airflow_trainpipe.config.data import ValidationSplit
    from airflow_trainpipe.contracts.train_spec import TrialRung

    split = ValidationSplit(fraction=0.2, seed=0)
    with pytest.raises(ValidationError, match="rungs must increase"):
        TrialRung(number=0, validation=split, final=True, rungs=ends, study_name="s", trial_id=1)
    with pytest.raises(ValidationError, match="names its study_name and trial_id"):
        TrialRung(number=0, validation=split, final=True, rungs=[1])


def test_a_study_that_cannot_be_opened_is_named_and_retryable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_trainpipe.runtime.rungs import StudyUnreachable, TrialRungs

    base = _base(tmp_path / "checkpoints", ["file:///unused.parquet"])
    study, _ = _study(tmp_path, base, earlier=0.5)
    spec, _ = _trial_spec(base, study)
    assert spec.trial is not None
    # An SQLite file in a folder that does not exist: the database cannot be opened.
    monkeypatch.setenv(STORAGE_ENV, f"sqlite:///{tmp_path / 'missing' / 'study.db'}")
    with pytest.raises(StudyUnreachable, match="cannot open study 'rungs'") as caught:
        TrialRungs(spec.trial, base.config).decide({1: 0.7}, 1)
    assert caught.value.retryable


def test_a_diverged_rung_stops_the_trial_without_asking_the_study(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_trainpipe.runtime.rungs import TrialRungs

    monkeypatch.delenv(STORAGE_ENV, raising=False)
    base = _base(tmp_path / "checkpoints", ["file:///unused.parquet"])
    study, _ = _study(tmp_path, base, earlier=0.5)
    spec, trial = _trial_spec(base, study)
    assert spec.trial is not None
    # No storage URL in the environment: a question to the study would raise.
    assert TrialRungs(spec.trial, base.config).decide({1: float("nan")}, 1) is True
    assert study._storage.get_trial(trial._trial_id).intermediate_values == {}


def test_a_resumed_trial_counts_the_study_time_of_the_attempt_before_it(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    # Rungs at epochs 1 and 2; the first attempt asks at 1, checkpoints in epoch 2 and is killed.
    base = _base(tmp_path / "checkpoints", job_files)
    study, url = _study(tmp_path, base, earlier=0.01)
    assert base.config.tuning is not None
    trial = study.ask()
    ref = StudyRef(study_name=study.study_name, storage="", parent_run_id="", run_id="study")
    spec = rung_spec(
        base, ref, trial.number, base.hyperparameters, base.config.tuning, EPOCHS, True,
        rungs=[1, 2], trial_id=trial._trial_id,
    )  # fmt: skip
    # 26 steps an epoch: checkpoints at 25, 26 (the rung's) and 30, then killed after step 32.
    killed = run_job(spec, 1, env={STORAGE_ENV: url}, pause_at="step:32")
    assert killed.code != 0 and killed.result is None, killed.text[-3000:]
    assert "checkpoints/step_000000030" in killed.text and "TRAINPIPE PAUSED step:32" in killed.text

    resumed = run_job(spec, 1, env={STORAGE_ENV: url})
    assert resumed.code == 0, resumed.text[-3000:]
    result = resumed.result
    assert result is not None and result["resumed_from_step"] == 30
    assert [r["resource"] for r in result["rungs"]] == [1, 2]
    # This attempt asked at rung 2 only; the result counts the first attempt's ask at rung 1 too,
    # carried by checkpoint 30 (what the trial's full-budget estimate leaves out).
    this_attempt = result["timing"]["study_s"] * result["world_size"]
    assert 0 < this_attempt < result["study_compute_hours"] * 3600
