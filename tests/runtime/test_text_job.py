"""A text pipeline's training job, for real (torchrun, 2 ranks, DeepSpeed on gloo): the
support_tickets example's text encoder on a day of tickets, killed mid-epoch and resumed bit-exact
from the token cache its first attempt wrote, ending step for step where `trainpipe train` of the
same config and day ends uninterrupted (the one reference run); then its registered model, in a
fresh interpreter, scores raw rows with raw text exactly as the job scored them."""

from __future__ import annotations

import contextlib
import io
import json
from datetime import date
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.artifacts import RESULT_ARTIFACT
from airflow_trainpipe.contracts.events import parse
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.examples.synthetic import write_day
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.jobs import JobRun, holdout_rows, run_job, served_in_a_fresh_interpreter

pytestmark = pytest.mark.slow

MODEL_NAME = "ticket_router_test"


def _config_text(checkpoints: Path) -> str:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "support_tickets.yaml").read_text())
    config["training"]["checkpoint"].update(uri=checkpoints.as_uri(), every_steps=5)
    # A tiny encoder and small batches: ~40 steps, what a resume needs; the bench trains the real size.
    config["training"]["hyperparameters"].update(epochs=2, batch_size=8, gradient_accumulation_steps=2)
    # The levers a CPU rank runs (training.speed): a resume must be bit-exact with them too.
    config["training"]["speed"] = {
        "optimizer": "fused", "attention": "eager", "group_by_length": True, "packing": True, "fused_qkv": True,
    }  # fmt: skip
    config["training"]["hyperparameters"]["model_args"].update(hidden_size=32, num_layers=1, num_heads=2)
    return yaml.safe_dump(config, sort_keys=False)


@pytest.fixture(scope="module")
def tickets(tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("text_job")
    files = write_day(root.as_uri(), date(2026, 1, 1), 800, seed=5, kind="support_tickets")
    text = _config_text(root / "checkpoints")
    (root / "support_tickets.yaml").write_text(text)
    return {"root": root, "files": files, "config": parse_config(text)}


def _spec(tickets: dict[str, Any], run_id: str) -> TrainSpec:
    return TrainSpec(config=tickets["config"], run_id=run_id, data_files=tickets["files"])


@pytest.fixture(scope="module")
def resumed(tickets: dict[str, Any], trainpipe_home: Path) -> tuple[JobRun, JobRun, set[Path]]:
    """(the killed first attempt, its retry, the token id files the first attempt wrote): the first
    attempt tokenizes every block and is SIGKILLed at step 13, past its checkpoint of step 10."""
    spec = _spec(tickets, "killed_and_resumed")
    cache = trainpipe_home / "tokens"  # runtime/data/tokens.py: per node, per snapshot and tokenizer
    before = set(cache.rglob("*.npy"))
    killed = run_job(spec, pause_at="step:13")
    assert killed.code != 0 and killed.result is None, killed.text[-3000:]
    written = set(cache.rglob("*.npy")) - before
    return killed, run_job(spec), written


@pytest.fixture(scope="module")
def trained_by_the_cli(
    tickets: dict[str, Any], resumed: tuple[JobRun, JobRun, set[Path]]
) -> tuple[str, dict[str, Any]]:
    """`trainpipe train` of the example's config on the same day, uninterrupted: (its output, its
    result). After the resumed job, whose token cache it reads, as a later run of a pipeline would."""
    from airflow_trainpipe.cli import main

    config = str(tickets["root"] / "support_tickets.yaml")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        code = main(["train", config, "--run-id", "cli_day", "--data", *tickets["files"]])
    assert code == 0, output.getvalue()[-3000:]
    result = json.loads((local_path(_spec(tickets, "cli_day").run_dir) / RESULT_ARTIFACT).read_text())
    return output.getvalue(), result


def test_a_resumed_text_job_reads_the_token_cache_and_ends_bit_exact(
    resumed: tuple[JobRun, JobRun, set[Path]],
    trained_by_the_cli: tuple[str, dict[str, Any]],
    trainpipe_home: Path,
) -> None:
    killed, retry, written = resumed
    assert retry.code == 0, retry.text[-3000:]
    assert retry.result is not None and retry.result["resumed_from_step"] == 10
    assert retry.start is not None and retry.start["speed"] == {
        "fused_optimizer": True,
        "attention": "eager",
        "compiled": False,
        "fused_qkv": True,
        "immediate_grad_update": False,
        "group_by_length": True,
        "packing": True,
        "data_on_device": False,
    }
    # The first attempt tokenized its blocks into the cache (it was killed before it could say
    # so); the retry read every one from there, tokenizing none.
    assert "TRAINPIPE PAUSED step:13" in killed.text  # killed past its step-10 checkpoint, mid-epoch
    assert written and all(path.name.startswith("subject-") for path in written), written
    assert retry.text.count("token ids: 0 block(s) tokenized on this rank") == 2  # both ranks
    _, uninterrupted = trained_by_the_cli
    assert retry.result["weights_sha256"] == uninterrupted["weights_sha256"]
    # Step for step: the uninterrupted run's losses as its MLflow run recorded them.
    client = mlflow.MlflowClient(f"sqlite:///{trainpipe_home / 'mlflow.db'}")
    history = client.get_metric_history(uninterrupted["mlflow_run_id"], "train_loss")
    losses = {metric.step: metric.value for metric in history}
    assert retry.losses and set(retry.losses) <= set(losses), (sorted(retry.losses), sorted(losses))
    for step, loss in retry.losses.items():
        assert loss == losses[step], f"step {step}"


def test_the_registered_model_tokenizes_raw_text_as_the_job_did(
    tickets: dict[str, Any], resumed: tuple[JobRun, JobRun, set[Path]], trainpipe_home: Path, tmp_path: Path
) -> None:
    result = resumed[1].result
    assert result is not None
    mlflow.set_tracking_uri(f"sqlite:///{trainpipe_home / 'mlflow.db'}")
    version = mlflow.register_model(result["model_uri"], MODEL_NAME).version
    mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", version)
    logged = mlflow.artifacts.load_dict(f"runs:/{result['mlflow_run_id']}/holdout_predictions.json")
    rows = holdout_rows(tickets["files"], tickets["config"].data, logged["rows"])
    assert rows.column("body").null_count == 0 and rows.num_rows == logged["rows"] > 50
    served = served_in_a_fresh_interpreter(
        f"models:/{MODEL_NAME}@champion", rows, f"sqlite:///{trainpipe_home / 'mlflow.db'}", tmp_path
    )
    # (rows, classes) probabilities; the job cut each batch to its longest row, the exported
    # program reads every row at max_length: masked positions weigh exactly 0, sums may differ by ulps.
    np.testing.assert_allclose(served, np.array(logged["predictions"]), rtol=1e-5, atol=1e-6)
    assert served.shape == (logged["rows"], 4)


def test_trainpipe_train_of_the_example_trains_the_same_model(
    resumed: tuple[JobRun, JobRun, set[Path]], trained_by_the_cli: tuple[str, dict[str, Any]]
) -> None:
    output, result = trained_by_the_cli
    assert resumed[1].result is not None
    assert result["weights_sha256"] == resumed[1].result["weights_sha256"]
    assert result["resumed_from_step"] == 0
    assert f"training finished at step {result['final_step']}" in output


def test_a_retry_with_fused_qkv_flipped_is_refused_before_it_loads_the_checkpoint(
    tickets: dict[str, Any], resumed: tuple[JobRun, JobRun, set[Path]]
) -> None:
    """The checkpoint's model states read the same either way; its optimizer state does not."""
    config = tickets["config"]
    speed = config.training.speed.model_copy(update={"fused_qkv": False})
    flipped = config.model_copy(update={"training": config.training.model_copy(update={"speed": speed})})
    retry = run_job(TrainSpec(config=flipped, run_id="killed_and_resumed", data_files=tickets["files"]))
    assert retry.code != 0 and retry.result is None, retry.text[-3000:]
    errors = [e for e in map(parse, retry.output) if e and e["event"] == "error"]
    assert errors and all(e["retryable"] is False for e in errors), retry.text[-3000:]
    assert "laid out otherwise" in errors[0]["error"] and "training.speed.fused_qkv" in errors[0]["error"]
