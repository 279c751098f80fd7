"""A job scores its epochs on the validation split, registers its best epoch's weights (after a
retry too) and reads the gate's holdout once, at the end (runtime/best.py, runtime/finish.py)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from airflow_trainpipe.contracts.train_spec import TrainSpec
from tests.helpers.jobs import JobRun

pytestmark = pytest.mark.slow

# Loud enough that the validation ROC AUC stops improving within a few epochs: with patience 1 the
# job stops on the first epoch that is not its best, so its best epoch is never its last one.
OVERFIT = (
    ("epochs: 2", "epochs: 12"),
    ("early_stopping_patience: 5", "early_stopping_patience: 1"),
    (
        "learning_rate: 0.002",
        "learning_rate: 0.05\n    lr_schedule: linear",
    ),  # from scratch: constant by default
)


def _spec(root: Path, files: list[str], run_id: str) -> TrainSpec:
    from airflow_trainpipe.config import parse_config
    from tests.helpers.jobs import job_config_text

    text = job_config_text(root)
    for old, new in OVERFIT:
        assert old in text, old
        text = text.replace(old, new)
    return TrainSpec(config=parse_config(text), run_id=run_id, data_files=files)


def _epochs(run: JobRun) -> list[dict[str, Any]]:
    import json

    marker = "TRAINPIPE "
    events = [json.loads(line.split(marker, 1)[1]) for line in run.output if marker + "{" in line]
    return [e for e in events if e["event"] == "epoch"]


def _checkpoint_weights_sha(spec: TrainSpec, step: int) -> str:
    """The sha256 of the model weights a checkpoint holds (ZeRO-1, one rank: the module states
    file has them whole), as the job's weights_sha256 computes it."""
    import torch

    from airflow_trainpipe.core.storage import local_path
    from airflow_trainpipe.runtime.engine import weights_sha256
    from airflow_trainpipe.runtime.resume.checkpoint import tag_for

    states = local_path(spec.run_dir) / "checkpoints" / tag_for(step) / "mp_rank_00_model_states.pt"
    module = torch.load(states, map_location="cpu", weights_only=False)["module"]
    return weights_sha256({k: v.detach().float().cpu() for k, v in module.items()})


@pytest.fixture(scope="module")
def stopped_early(tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path, job_files: list[str]):
    from tests.helpers.jobs import run_job

    spec = _spec(tmp_path_factory.mktemp("best"), job_files, "stopped_early")
    run = run_job(spec, nproc=1, forked=True)  # the ranks are not the subject
    assert run.code == 0, run.text[-3000:]
    return spec, run


def test_epochs_are_scored_on_the_validation_split_and_the_holdout_once_at_the_end(stopped_early) -> None:
    spec, run = stopped_early
    assert spec.config.data.validation is not None  # 0.05 in the tests' job (tests/helpers/jobs.py)
    epochs = _epochs(run)
    assert epochs and all("validation_roc_auc" in e and "holdout_roc_auc" not in e for e in epochs)
    assert run.start is not None
    rows = run.start["train_rows"], run.start["validation_rows"], run.start["holdout_rows"]
    assert all(rows) and sum(rows) == 1200, rows  # three disjoint splits of the day's rows
    result = run.result
    assert result is not None and result["metrics_split"] == "holdout"
    # The registered weights' holdout metrics are the gate's candidate scores, not an epoch's.
    assert result["holdout_metrics"]["roc_auc"] == result["evaluation"]["candidate"]["roc_auc"]
    best = next(e for e in epochs if e["step"] == result["weights_step"])
    assert result["validation_metrics"]["roc_auc"] == best["validation_roc_auc"]

    from mlflow import MlflowClient

    from airflow_trainpipe.core.tracking_store import default_tracking_uri

    client = MlflowClient(default_tracking_uri())
    history = {
        name: client.get_metric_history(result["mlflow_run_id"], name)
        for name in ("validation_roc_auc", "holdout_roc_auc", "learning_rate")
    }
    assert len(history["validation_roc_auc"]) == len(epochs)  # each epoch's, once (the published one's too)
    assert len(history["holdout_roc_auc"]) == 1  # read once, at the end
    rates = [m.value for m in sorted(history["learning_rate"], key=lambda m: m.step)]
    assert len(rates) == result["final_step"] and rates[0] == pytest.approx(0.05)
    assert all(a >= b for a, b in itertools.pairwise(rates)) and rates[-1] < rates[0]  # linear decay


def test_the_registered_weights_are_the_best_epochs_not_the_last(stopped_early) -> None:
    spec, run = stopped_early
    epochs, result = _epochs(run), run.result
    assert result is not None and result["stopped_early"]
    values = [e["validation_roc_auc"] for e in epochs]
    best = epochs[values.index(max(values))]  # the first best: a tie is not an improvement
    assert best["step"] < epochs[-1]["step"] == result["final_step"]
    assert result["weights_step"] == best["step"]
    registered = result["weights_sha256"]
    assert registered == _checkpoint_weights_sha(spec, best["step"])
    assert registered != _checkpoint_weights_sha(spec, epochs[-1]["step"])


def test_a_retry_after_the_best_epoch_still_registers_the_best(
    stopped_early, tmp_path: Path, job_files: list[str]
) -> None:
    from tests.helpers.jobs import run_job

    _, reference = stopped_early
    assert reference.result is not None
    best_step = reference.result["weights_step"]
    spec = _spec(tmp_path, job_files, "retried")
    crashed = run_job(spec, nproc=1, forked=True, env={"TRAINPIPE_CRASH_AT": f"step:{best_step + 1}"})
    assert crashed.code != 0 and crashed.result is None
    retried = run_job(spec, nproc=1, forked=True)
    assert retried.code == 0, retried.text[-3000:]
    assert retried.result is not None and retried.result["resumed_from_step"] == best_step
    assert retried.result["weights_step"] == best_step
    assert retried.result["weights_sha256"] == reference.result["weights_sha256"]


def test_weights_a_run_stopped_mid_epoch_ends_on_are_scored_and_logged(
    tmp_path: Path, trainpipe_home: Path, job_files: list[str]
) -> None:
    from mlflow import MlflowClient

    from airflow_trainpipe.core.tracking_store import default_tracking_uri
    from tests.helpers.jobs import make_spec, run_job

    # The tests' job (a rate that still improves it) on one rank: global batch 24, 38-step epochs;
    # the run stops in the second.
    spec = make_spec(tmp_path, job_files, "mid_epoch").limited_to(50)
    run = run_job(spec, nproc=1, forked=True)
    assert run.code == 0, run.text[-3000:]
    result = run.result
    assert result is not None and result["final_step"] == 50
    history = MlflowClient(default_tracking_uri()).get_metric_history(
        result["mlflow_run_id"], "validation_roc_auc"
    )
    logged = {m.step: m.value for m in history}
    assert 38 in logged  # the epoch end
    # The published weights' validation score is in MLflow, once, at its step: the final weights'
    # (step 50), or the epoch's when restore_best chose it (logged at the epoch end already).
    assert result["weights_step"] == 50  # still improving: restore_best keeps the final weights
    assert logged[result["weights_step"]] == result["validation_metrics"]["roc_auc"]
    assert len(history) == len(logged)
