"""Tuning works unchanged on a fine-tuned pipeline: `trainpipe tune` of the support_tickets_finetune
example (ZeRO-3 over a pretrained directory) runs its trials through their rungs, every trial's job
reads the same pinned bytes, and the study's summary names its best trial."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import date
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.pretrained import save_encoder_directory

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_trainpipe_tune_of_a_fine_tuned_pipeline(tmp_path: Path) -> None:
    from airflow_trainpipe.examples.synthetic import write_day

    home = tmp_path / "home"
    files = write_day(
        (home / "data" / "support_tickets").as_uri(), date(2026, 1, 2), 900, seed=4, kind="support_tickets"
    )
    table = pq.read_table(files[0].removeprefix("file://"), columns=["subject", "body"])
    texts = [f"{s} {b}" for s, b in zip(table["subject"].to_pylist(), table["body"].to_pylist(), strict=True)]
    save_encoder_directory(home / "encoders" / "support_tickets", texts, vocab_size=300, hidden_size=32)
    config = yaml.safe_load((EXAMPLE_CONFIGS / "support_tickets_finetune.yaml").read_text())
    training = config["training"]
    training["hyperparameters"].update(
        batch_size=32, epochs=2, model_args={"dropout": 0.0, "head_hidden_sizes": [16]}
    )
    training["checkpoint"].update(every_steps=5)
    config["validation"]["volume"] = {"min_rows": 100}
    config["tuning"] = {
        "space": {"learning_rate": {"type": "float", "low": 1.0e-4, "high": 1.0e-2, "log": True}},
        "sampler": {"kind": "random", "seed": 0},
        "pruning": {
            "kind": "successive_halving",
            "resource": "epochs",
            "min_resource": 1,
            "reduction_factor": 2,
        },
        "budget": {"trials": 2, "max_parallel": 1},
        # One-rank trials, forked from the warm parent as `trainpipe tune` runs CPU trials (~6 s
        # less per job than torchrun): the subject is the study's pin and rungs, which do not
        # depend on the ranks; ZeRO-3 over 2 ranks of this encoder is tests/runtime/pretrained's.
        "nproc_per_trial": 1,
    }
    path = tmp_path / "tuned.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    env = {**os.environ, "TRAINPIPE_HOME": str(home)}
    env.pop("MLFLOW_TRACKING_URI", None)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "trainpipe"), "tune", str(path), "--ds", "2026-01-02", "-v"],
        env=env, capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["trials"] == 2 and summary["best"] is not None
    # One pin for the study, in its run directory: every trial (and the baseline) read those bytes.
    [pin] = list(home.rglob("pretrained.json"))
    assert pin.parent.name == "tune-2026-01-02"
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("support_tickets_finetune")
    runs = client.search_runs([experiment.experiment_id])
    shas = {
        run.data.tags.get("trainpipe.pretrained_sha256") for run in runs if "trainpipe.trial" in run.data.tags
    }
    assert shas == {json.loads(pin.read_text())["sha256"]}
    # Through their rungs: every trial reported its first rung (1 epoch) to the study, the pruner
    # decided on it, and a trial that went on reported its second.
    import optuna

    study = optuna.load_study(
        study_name="support_tickets_finetune:tune-2026-01-02",
        storage=f"sqlite:///{home / 'optuna' / 'support_tickets_finetune.db'}",
    )
    trials = study.get_trials()
    assert len(trials) == 2 and all(1 in t.intermediate_values for t in trials), [
        (t.number, t.state.name, t.intermediate_values) for t in trials
    ]
    for trial in trials:
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert sorted(trial.intermediate_values) == [1, 2] and trial.value == trial.intermediate_values[2]
        else:
            assert trial.state == optuna.trial.TrialState.PRUNED and sorted(trial.intermediate_values) == [1]
