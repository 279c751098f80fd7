"""tuning.study: storage URLs, per-slot samplers, the pruners, and the search space on a real study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.config.tuning import SamplerSection
from airflow_trainpipe.tuning.study import (
    as_overrides,
    open_study,
    pruner,
    sampler,
    storage_url,
    suggest,
    trial_hyperparameters,
)
from tests.conftest import EXAMPLE_CONFIGS

TUNED = (EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text()


def _config(**tuning: object):
    config = yaml.safe_load(TUNED)
    config["tuning"].update(tuning)
    return parse_config(yaml.safe_dump(config), "tuned.yaml")


def test_the_default_storage_is_an_sqlite_file_per_pipeline_under_the_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path))
    assert storage_url(_config()) == f"sqlite:///{tmp_path}/optuna/fraud_detector_tuned.db"
    # An Airflow PostgreSQL connection's URI is postgres://, which SQLAlchemy 2 does not read.
    assert storage_url(_config(), "postgres://u:p@db:5432/optuna") == "postgresql://u:p@db:5432/optuna"
    assert storage_url(_config(), "postgresql+psycopg2://db/o") == "postgresql+psycopg2://db/o"


def test_each_slot_draws_its_own_values_and_the_same_again(tmp_path: Path) -> None:
    config = _config(sampler={"kind": "random", "seed": 3})
    assert config.tuning is not None

    def first_draw(slot: int) -> dict:
        study = optuna.create_study(sampler=sampler(config.tuning.sampler, slot))  # type: ignore[union-attr]
        return suggest(study.ask(), config.tuning)  # type: ignore[arg-type]

    assert first_draw(0) != first_draw(1)  # parallel trials in separate processes differ
    assert first_draw(1) == first_draw(1)  # a slot that runs again draws what it drew
    qmc = [sampler(SamplerSection(kind="qmc", seed=3), slot) for slot in (0, 5)]
    assert all(isinstance(s, optuna.samplers.QMCSampler) for s in qmc)


def test_list_choices_round_trip_and_become_model_args() -> None:
    config = _config()
    assert config.tuning is not None
    study = optuna.create_study(sampler=sampler(config.tuning.sampler, 2))
    trial = study.ask()
    params = suggest(trial, config.tuning)
    assert params["model_args.hidden_sizes"] in ([32], [64, 32], [128, 64])
    assert params["batch_size"] in (128, 256, 512)
    # Asking again (a continued trial) returns the stored values.
    assert suggest(optuna.Trial(study, trial._trial_id), config.tuning) == params
    hp = trial_hyperparameters(config.training.hyperparameters, params)
    assert hp.model_args == {
        "hidden_sizes": params["model_args.hidden_sizes"],
        "dropout": params["model_args.dropout"],
    }
    assert hp.learning_rate == params["learning_rate"] and hp.epochs == 3
    overrides = as_overrides(config.training.hyperparameters, params)
    assert set(overrides) <= {"learning_rate", "weight_decay", "batch_size", "model_args"}


def test_the_pruners_are_optunas() -> None:
    assert isinstance(pruner(_config()), optuna.pruners.SuccessiveHalvingPruner)
    hyperband = pruner(_config(pruning={"kind": "hyperband", "min_resource": 1, "reduction_factor": 3}))
    assert isinstance(hyperband, optuna.pruners.HyperbandPruner) and hyperband._max_resource == 3
    assert isinstance(pruner(_config(pruning={"kind": "none"})), optuna.pruners.NopPruner)


def test_the_study_is_found_again_with_what_it_holds(tmp_path: Path) -> None:
    config = _config()
    url = f"sqlite:///{tmp_path / 'studies.db'}"
    study = open_study(config, "fraud_detector_tuned:r1", url)
    study.tell(study.ask(), 0.7)
    again = open_study(config, "fraud_detector_tuned:r1", url)
    assert [t.value for t in again.trials] == [
        0.7
    ] and again.direction == optuna.study.StudyDirection.MAXIMIZE
    assert again.user_attrs["metric"] == "roc_auc"
    assert open_study(config, "fraud_detector_tuned:r2", url).trials == []  # one study per run


def test_a_trial_whose_job_cannot_succeed_is_recorded_failed_at_once(tmp_path: Path) -> None:
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.runtime.data.reader import DataError
    from airflow_trainpipe.tuning.outcomes import StudyRef
    from airflow_trainpipe.tuning.trials import run_trial

    config = _config()
    study = open_study(config, "fraud_detector_tuned:r1", f"sqlite:///{tmp_path / 's.db'}")
    ref = StudyRef(
        study_name="fraud_detector_tuned:r1", storage="sqlite:///x", parent_run_id="p", run_id="r1"
    )
    base = TrainSpec(config=config, run_id="r1", data_files=[(tmp_path / "x.parquet").as_uri()])

    def launch(spec: TrainSpec):
        raise DataError("x.parquet lacks column(s) is_fraud")  # what a retry would meet again

    with pytest.raises(DataError):
        run_trial(config, study, ref, 0, base, launch, last_attempt=False)
    (trial,) = study.trials
    assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs["outcome"]["state"] == "failed"
    # A slot that runs again returns the ended trial instead of starting another.
    assert run_trial(config, study, ref, 0, base, launch).state == "failed" and len(study.trials) == 1


def test_no_trial_starts_once_the_compute_budget_is_spent(tmp_path: Path) -> None:
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.tuning.outcomes import StudyRef
    from airflow_trainpipe.tuning.trials import run_trial

    config = _config(budget={"trials": 4, "max_parallel": 2, "max_compute_hours": 0.5})
    study = open_study(config, "fraud_detector_tuned:r1", f"sqlite:///{tmp_path / 's.db'}")
    spent = study.ask()
    spent.set_user_attr("compute_hours", 0.5)
    study.tell(spent, 0.7)
    ref = StudyRef(
        study_name="fraud_detector_tuned:r1", storage="sqlite:///x", parent_run_id="p", run_id="r1"
    )
    base = TrainSpec(config=config, run_id="r1", data_files=[(tmp_path / "x.parquet").as_uri()])

    def launch(spec: TrainSpec):
        raise AssertionError("no job may start")

    outcome = run_trial(config, study, ref, 1, base, launch)
    assert outcome.state == "not_started" and len(study.trials) == 1


def _told(study: optuna.Study, number: int, state: str, value: float, run_id: str) -> None:
    """A trial told as run_trial tells it: its outcome in the user attrs, its value in the study."""
    from airflow_trainpipe.contracts.payloads import TrainResult, TrainTiming
    from airflow_trainpipe.tuning.outcomes import RungReport, TrialOutcome

    trial = study.ask()
    timing = TrainTiming(steps=10, loop_s=1.0, train_s=1.0, checkpoint_s=0.0, eval_s=0.0, data_wait_s=0.0)
    result = TrainResult(
        final_step=90, final_train_loss=0.3, holdout_metrics={"roc_auc": value}, weights_sha256="w", resumed_from_step=0,
        steps_recomputed=0, epochs_completed=3, stopped_early=False, world_size=1, timing=timing,
        mlflow_run_id=run_id, mlflow_experiment_id="1", transform_hash="t", evaluation=None,
        model_uri=f"runs:/{run_id}/model", metrics_split="validation",
    )  # fmt: skip
    complete = state == "complete"
    outcome = TrialOutcome(
        number=trial.number, slot=number, state=state, params={"learning_rate": 0.001 * (number + 1)},  # type: ignore[arg-type]
        value=value, rungs=[RungReport(resource=1, value=value)], compute_hours=0.01,
        full_budget_compute_hours=0.01 if complete else 0.03, mlflow_run_id=run_id, run_dir=None,
        result=result if complete else None,
    )  # fmt: skip
    trial.set_user_attr("outcome", outcome.to_xcom())
    if complete:
        study.tell(trial, value)
    else:
        trial.report(value, 1)
        study.tell(trial, state=optuna.trial.TrialState.PRUNED)


@pytest.mark.parametrize(("direction", "best"), [("maximize", 0), ("minimize", 2)])
def test_the_summary_names_the_best_complete_trial_whatever_their_order(
    tmp_path: Path, direction: str, best: int
) -> None:
    """The end-to-end studies (tests/operators/test_tune.py, tests/tuning/test_local.py) complete
    one trial: here the best of several is neither the first nor the last, and a pruned trial
    with a better value is no candidate."""
    from airflow_trainpipe.tuning.outcomes import StudyRef
    from airflow_trainpipe.tuning.report import summarize

    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}", direction=direction)
    values = {"maximize": [0.73, 0.95, 0.71, 0.72], "minimize": [0.73, 0.5, 0.7, 0.72]}[direction]
    ranked = sorted((0, 2, 3), key=lambda n: values[n], reverse=direction == "maximize")
    assert ranked[0] == best != 3  # not the last complete trial
    for number, value in enumerate(values):
        _told(study, number, "pruned" if number == 1 else "complete", value, f"run-{number}")
    ref = StudyRef(study_name="s", storage="sqlite:///x", parent_run_id="p", run_id="r1")
    summary = summarize(study, ref)
    assert (summary.trials, summary.complete, summary.pruned, summary.failed) == (4, 3, 1, 0)
    assert summary.direction == direction and summary.best_trial == best and summary.best == values[best]
    assert summary.best_params == {"learning_rate": 0.001 * (best + 1)}
    assert summary.candidate is not None and summary.candidate.mlflow_run_id == f"run-{best}"
    assert summary.compute_hours == pytest.approx(0.04)
    assert summary.full_budget_compute_hours == pytest.approx(0.06)
    assert summary.pruned_at_first_rung == 1
    # The warm parent the trials' jobs were forked from: once, in what was used and in the
    # estimate (a study without pruning forks its jobs the same way), and in the wall time.
    shared = summarize(study, ref, warm_parent_s=36.0)
    assert shared.compute_hours == pytest.approx(0.04 + 0.01)
    assert shared.full_budget_compute_hours == pytest.approx(0.06 + 0.01)
    assert shared.startup_compute_hours == pytest.approx(summary.startup_compute_hours + 0.01)
    assert shared.wall_s == pytest.approx(summary.wall_s + 36.0)


def test_a_pruned_trial_s_full_budget_estimate_scales_its_training_only(tmp_path: Path) -> None:
    """Start-up and end once; training per epoch times the full budget; the rung's round trip to
    the study not at all (a study without pruning never makes it): 1 epoch of 3 reached."""
    from airflow_trainpipe.tuning.outcomes import RungReport, TrialOutcome
    from airflow_trainpipe.tuning.trials import _end

    study = optuna.create_study(study_name="s", storage=f"sqlite:///{tmp_path / 's.db'}")
    trial = study.ask()
    trial.report(0.7, 1)
    outcome = TrialOutcome(
        number=trial.number, slot=0, state="pruned", params={}, value=0.7, rungs=[RungReport(resource=1, value=0.7)],
        compute_hours=0.010, startup_compute_hours=0.004, end_compute_hours=0.001, study_compute_hours=0.001,
        full_budget_compute_hours=None, mlflow_run_id=None, run_dir=None,
    )  # fmt: skip
    ended = _end(study, trial, outcome, optuna.trial.TrialState.PRUNED, full_resource=3)
    assert ended.full_budget_compute_hours == pytest.approx(0.004 + 0.001 + (0.010 - 0.005 - 0.001) * 3)
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
