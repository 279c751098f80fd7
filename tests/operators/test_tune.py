"""The tuning tasks: tune_start -> trial (mapped) -> tune -> train, through Airflow's own dag.test().

The DAG is the factory's, from the example tuned config on a small synthetic day. Every trial that
survives the first rung is killed mid-rung on its try 1 (every rank SIGKILLs itself at step 42);
Airflow retries the mapped task instance and the trial continues from its own checkpoint.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest
import yaml

from airflow_trainpipe.operators.tune import TuningResultOperator, TuningStartOperator, TuningTrialOperator
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import RESULT_MARK, dag_test_env

# Trial 0 always survives the first rung (and is killed in the second); 1 and 2 are pruned at it
# unless each beats those before it, which successive halving promotes: the values are float
# results that differ between machines, so the test takes either. Each further trial is more
# training jobs; the best of several complete trials and the compute a pruned trial saves are
# tests/tuning/test_study.py's.
TRIALS = 3
# 3000 rows, 20% holdout, 20% of the rest validation: ~29 steps of 64 rows per epoch.
CRASH_STEP = 42  # in the second rung (epochs 2-3), between the checkpoints of steps 40 and 45


def test_template_fields_are_public_api() -> None:
    assert TuningStartOperator.template_fields == ("run_id", "enabled")
    assert TuningTrialOperator.template_fields == (
        "run_id",
        "partition",
        "validation",
        "data_files",
        "data_digest",
        "hyperparameter_overrides",
        "tuned",
        "study",
    )
    assert TuningResultOperator.template_fields == ("study",)


def test_tune_waits_for_every_trial_and_needs_one_success() -> None:
    operator = TuningResultOperator(
        task_id="tune", config=str(EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml"), study={}
    )
    assert operator.trigger_rule == "all_done_min_one_success"


DAG_FILE = f"""
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from airflow_trainpipe.factory import register_pipelines

register_pipelines(Path(__file__).parent / "configs", globals())

if __name__ == "__main__":
    # The trials' and the untuned run's CPU jobs are forked from the warm parent
    # (TRAINPIPE_FORK_LOCAL_JOBS, set by dag_test_env, as `trainpipe tune` runs its CPU trials)
    # instead of started as the torchrun command: ~6 s less per job, and the trials are 4-6 jobs.
    # Each is still its own job that runs the entrypoint's main and SIGKILLs itself at the crash
    # step. What is proven here is Airflow's side (mapped trials, the retry, the resume from the
    # trial's checkpoint, the study's pick); the train task under the command is test_train.py's.
    dag = globals()["fraud_detector_tuned"]
    for day, conf in (("2026-01-02", {{}}), ("2026-01-03", {{"tune": False}})):
        if conf:  # the crash is the trials' (a train task's retry is tests/operators/test_train.py's)
            os.environ.pop("TRAINPIPE_CRASH_AT")
        run = dag.test(logical_date=datetime.fromisoformat(day).replace(tzinfo=timezone.utc), run_conf=conf)
        tis = {{f"{{ti.task_id}}[{{ti.map_index}}]": [str(ti.state), ti.try_number] for ti in run.get_task_instances()}}
        print({RESULT_MARK!r} + json.dumps({{"state": str(run.state), "tis": tis}}), flush=True)
"""


def _tuned_config(folder: Path) -> None:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text())
    config["schedule"].update(retries=1, retry_delay="1s")
    config["training"]["hyperparameters"].update(batch_size=64, epochs=3)
    config["training"]["checkpoint"].update(every_steps=5, keep_last=2)
    tuning = config["tuning"]
    tuning["space"].pop("batch_size")  # a fixed number of steps per epoch: the crash lands mid-rung
    tuning["budget"].update(trials=TRIALS)
    folder.mkdir()
    (folder / "fraud_detector_tuned.yaml").write_text(yaml.safe_dump(config))


def _xcoms(airflow_home: Path, task_id: str) -> list[tuple[str, int, dict]]:
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        rows = db.execute(
            "select r.logical_date, x.map_index, x.value from xcom x join dag_run r on x.dag_run_id = r.id "
            "where x.task_id = ? and x.key = 'return_value' order by r.logical_date, x.map_index",
            (task_id,),
        ).fetchall()
    return [(day, index, json.loads(value)) for day, index, value in rows]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_study_of_mapped_trials_picks_the_candidate_and_killed_trials_resume(
    tmp_path: Path, migrated_airflow_db: Path, migrated_mlflow_db: Path
) -> None:
    from mlflow import MlflowClient

    from airflow_trainpipe.examples.synthetic import write_day

    env = dag_test_env(tmp_path, migrated_airflow_db, migrated_mlflow=migrated_mlflow_db)
    env.update(TRAINPIPE_CRASH_AT=f"step:{CRASH_STEP}", TRAINPIPE_FAULT_TRY="1")
    home = Path(env["TRAINPIPE_HOME"])
    for day in (2, 3):
        write_day((home / "data" / "card_transactions").as_uri(), date(2026, 1, day), 3000, seed=day)
    dags = Path(env["AIRFLOW__CORE__DAGS_FOLDER"])
    _tuned_config(dags / "configs")
    (dags / "tuned.py").write_text(DAG_FILE)
    done = subprocess.run(
        [sys.executable, str(dags / "tuned.py")], env=env, capture_output=True, text=True, timeout=840
    )
    output = done.stdout + done.stderr
    runs = [
        json.loads(line.split(RESULT_MARK, 1)[1]) for line in done.stdout.splitlines() if RESULT_MARK in line
    ]
    assert len(runs) == 2, output[-8000:]
    tuned, untuned = runs
    assert tuned["state"] == "success", (tuned, output[-8000:])
    trials = {k: v for k, v in tuned["tis"].items() if k.startswith("trial[")}
    assert sorted(trials) == [f"trial[{i}]" for i in range(TRIALS)]
    assert all(state == "success" for state, _ in trials.values()), trials

    airflow_home = Path(env["AIRFLOW_HOME"])
    outcomes = {index: value for _, index, value in _xcoms(airflow_home, "trial")}
    assert len(outcomes) == TRIALS
    survivors = [o for o in outcomes.values() if len(o["rungs"]) == 2]
    assert survivors, outcomes
    for index, outcome in outcomes.items():
        _, tries = trials[f"trial[{index}]"]
        assert [r["resource"] for r in outcome["rungs"]] == [1, 3][: len(outcome["rungs"])]
        if len(outcome["rungs"]) == 1:
            assert outcome["state"] == "pruned" and tries == 1  # never reached the crash step
            continue
        # Killed at step 42 on try 1; try 2 resumed from the trial's newest complete checkpoint
        # (past the first rung's end at step 30), not from the rung's start.
        assert outcome["state"] == "complete" and tries == 2
        result = outcome["result"]
        per_epoch = result["final_step"] // 3
        assert result["final_step"] == 3 * per_epoch and result["metrics_split"] == "validation"
        assert per_epoch < result["resumed_from_step"] < CRASH_STEP

    (_, _, summary) = _xcoms(airflow_home, "tune")[0]
    best = max(survivors, key=lambda o: o["value"])
    assert summary["trials"] == TRIALS and summary["complete"] == len(survivors)
    assert summary["best_trial"] == best["number"] and summary["best"] == best["value"]
    pruned = TRIALS - len(survivors)
    assert summary["pruned"] == pruned
    # Without pruning no job would have asked the study at its rung ends: those round trips (every
    # attempt's: a survivor's first ask was in the try killed at CRASH_STEP) are in what the study
    # spent, not in the estimate, and with rungs this short they can outweigh what pruning saved
    # (CI measured 0.003610 device-hours against 0.003588).
    asking = sum(o["study_compute_hours"] for o in outcomes.values())
    assert asking > 0, outcomes
    if pruned:  # a pruned trial never ran its last rung, which the full budget counts
        for outcome in outcomes.values():
            if outcome["state"] == "pruned":
                spent = outcome["compute_hours"] - outcome["study_compute_hours"]
                assert outcome["full_budget_compute_hours"] > spent, outcome
        assert summary["compute_hours"] - asking < summary["full_budget_compute_hours"]
    else:  # every trial ran its full budget: the estimate is what each spent outside the asks
        assert summary["compute_hours"] - asking == pytest.approx(summary["full_budget_compute_hours"])
    # The gate's candidate is the best trial's own model: train adopted it, register registered it.
    (_, _, train) = _xcoms(airflow_home, "train")[0]
    assert train["mlflow_run_id"] == best["mlflow_run_id"] == summary["candidate"]["mlflow_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    (version,) = client.search_model_versions("name = 'fraud_detector_tuned'")
    assert version.run_id == best["mlflow_run_id"]
    parent = client.get_run(summary["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.params["best.learning_rate"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id, "study")} >= {
        "study/optimization_history.png",
        "study/intermediate_values.png",
    }
    children = client.search_runs(
        [parent.info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'"
    )
    assert sorted(int(r.data.tags["trainpipe.trial"]) for r in children) == sorted(
        o["number"] for o in outcomes.values()
    )
    assert {r.data.tags["trainpipe.trial_state"] for r in children} <= {"complete", "pruned"}

    # The trigger form's `tune: false`: the study's tasks are skipped and train trains once.
    assert untuned["state"] == "success", (untuned, output[-8000:])
    assert untuned["tis"]["tune_start[-1]"][0] == "skipped" and untuned["tis"]["tune[-1]"][0] == "skipped"
    # (No crash is injected into this run: its job trains once, from step 0, on one try.)
    assert untuned["tis"]["train[-1]"] == ["success", 1]
    (_, _, second) = _xcoms(airflow_home, "train")[1]
    assert second["metrics_split"] == "holdout" and second["resumed_from_step"] == 0
    assert second["final_step"] > CRASH_STEP  # it trained past the step where the trials crashed
    assert second["mlflow_run_id"] not in {o["mlflow_run_id"] for o in outcomes.values()}


def _summary(**changes: object) -> dict:
    from airflow_trainpipe.tuning.outcomes import TuningSummary

    fields: dict = {
        "study_name": "fraud_detector_tuned:r1", "direction": "maximize", "metric": "roc_auc", "trials": 4,
        "complete": 2, "pruned": 2, "failed": 0, "best_trial": 3, "best": 0.8,
        "best_params": {"learning_rate": 0.005, "model_args.hidden_sizes": [32]}, "compute_hours": 0.1,
        "full_budget_compute_hours": 0.2, "pruned_at_first_rung": 2, "parent_run_id": "p", "candidate": None,
    }  # fmt: skip
    return TuningSummary.model_validate({**fields, **changes}).to_xcom()


def test_retrain_trains_with_the_best_trials_hyperparameters_over_the_forms(tmp_path: Path) -> None:
    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.operators.train import DistributedTrainOperator

    text = (
        (EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text().replace("retrain: false", "retrain: true")
    )
    operator = DistributedTrainOperator(
        task_id="train",
        config=parse_config(text, "tuned.yaml"),
        data_files=[(tmp_path / "x.parquet").as_uri()],
        hyperparameter_overrides={"learning_rate": 0.01, "epochs": 5},
        tuned=json.dumps(_summary()),  # as the template renders it
    )
    hp = operator._hyperparameters(retrain=operator._tuning_summary())
    assert (hp.learning_rate, hp.epochs) == (0.005, 5)  # the study's value wins; the form's epochs stay
    assert hp.model_args == {"hidden_sizes": [32], "dropout": 0.1}
    operator.tuned = "null"  # tuning turned off for the run: the form's values only
    assert operator._tuning_summary() is None
    assert operator._hyperparameters(retrain=operator._tuning_summary()).learning_rate == 0.01


def test_adopting_needs_a_completed_trial() -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_trainpipe.operators.train import DistributedTrainOperator

    operator = DistributedTrainOperator(
        task_id="train", config=str(EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml"), tuned=_summary()
    )
    with pytest.raises(AirflowFailException, match="study fraud_detector_tuned:r1 has no completed trial"):
        operator.execute({})  # type: ignore[arg-type]


def test_tuning_turned_off_in_the_form_skips_the_study() -> None:
    from airflow.sdk.exceptions import AirflowSkipException

    operator = TuningStartOperator(
        task_id="tune_start", config=str(EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml"), enabled="False"
    )
    with pytest.raises(AirflowSkipException, match="tuning is off for this run"):
        operator.execute({})  # type: ignore[arg-type]


def test_the_study_lives_in_postgresql_through_an_airflow_connection(
    postgres_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Production's storage: a real PostgreSQL server, named by an Airflow connection whose URI is
    postgres:// (as Airflow writes it); a second task opening the study finds what the first wrote."""
    import optuna
    import sqlalchemy

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.operators.tune import _storage_url
    from airflow_trainpipe.tuning.study import open_study

    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path))  # the parent run's embedded MLflow store
    monkeypatch.setenv("AIRFLOW_CONN_OPTUNA_DB", postgres_server.url)
    text = (EXAMPLE_CONFIGS / "fraud_detector_tuned.yaml").read_text()
    config = parse_config(
        text.replace("  retrain: false", "  retrain: false\n  storage_conn_id: optuna_db"), "t.yaml"
    )
    start = TuningStartOperator(task_id="tune_start", config=config, run_id="manual__2026-01-02")
    ref = start.execute({})  # type: ignore[arg-type]
    assert ref["study_name"] == "fraud_detector_tuned:manual__2026-01-02"
    assert ref["storage"].startswith("postgresql://") and "@127.0.0.1:" in ref["storage"]  # user masked
    url = _storage_url(config)
    study = open_study(config, ref["study_name"], url)
    trial = study.ask()
    trial.set_user_attr("slot", 0)
    study.tell(trial, 0.75)
    # Another task, another process: the same study, with the finished trial, from PostgreSQL.
    again = open_study(config, ref["study_name"], url)
    assert [(t.state, t.value, t.user_attrs["slot"]) for t in again.trials] == [
        (optuna.trial.TrialState.COMPLETE, 0.75, 0)
    ]
    with sqlalchemy.create_engine(url).connect() as db:
        names = db.execute(sqlalchemy.text("select study_name from studies")).scalars().all()
    assert names == [ref["study_name"]]
