"""Fine-tuning a pretrained Hugging Face directory for real: torchrun, 2 ranks, DeepSpeed ZeRO-3
on gloo, the encoder built partitioned (transformers' DeepSpeed integration) and loaded a layer
at a time. The job must start from the directory's weights, not a fresh init; its registered
model is one Hugging Face directory `transformers` loads directly, and the MLflow pyfunc scores
raw text with it; the next pipeline fine-tunes from that champion (`models:/NAME@champion`),
head included; a killed job resumes bit-exact from its pin; an S3 directory is fetched once per
node and checked against the pin."""

from __future__ import annotations

import json
import shutil
from datetime import date
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory, directory_sha256
from airflow_trainpipe.runtime.pretrained.source import node_directory
from airflow_trainpipe.runtime.tracking import RUN_ID_FILE
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.jobs import JobRun, holdout_rows, run_job, served_in_a_fresh_interpreter
from tests.helpers.pretrained import save_encoder_directory

pytestmark = pytest.mark.slow

MODEL_NAME = "pretrained_router_test"


def _config(
    root: Path, pretrained: str, deepspeed: dict[str, Any] | None = None, **hyperparameters: Any
) -> Any:
    config = yaml.safe_load((EXAMPLE_CONFIGS / "support_tickets.yaml").read_text())
    config["features"]["text"]["subject"] = {"max_length": 64}  # the directory's tokenizer applies
    training = config["training"]
    training["pretrained"] = pretrained
    training["deepspeed"] = {"zero_stage": 3, **(deepspeed or {})}
    training["checkpoint"].update(uri=(root / "checkpoints").as_uri(), every_steps=5)
    # A constant rate: the tests compare runs of different lengths step by step, and a decaying
    # schedule (a fine-tune's default) spans each run's own steps.
    training["hyperparameters"].update(
        epochs=1, batch_size=16, model_args={"dropout": 0.0, "head_hidden_sizes": [16]},
        lr_schedule="constant", **hyperparameters,
    )  # fmt: skip
    return parse_config(yaml.safe_dump(config, sort_keys=False))


@pytest.fixture(scope="module")
def tickets(tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path) -> dict[str, Any]:
    mlflow.set_tracking_uri(f"sqlite:///{trainpipe_home / 'mlflow.db'}")  # the jobs' store
    root = tmp_path_factory.mktemp("pretrained_job")
    files = write_day(root.as_uri(), date(2026, 1, 1), 600, seed=5, kind="support_tickets")
    table = pq.read_table(files[0].removeprefix("file://"))
    texts = [f"{s} {b}" for s, b in zip(table["subject"].to_pylist(), table["body"].to_pylist(), strict=True)]
    encoder = save_encoder_directory(root / "encoder", texts, vocab_size=300, hidden_size=32, seed=3)
    return {"root": root, "files": files, "encoder": encoder}


def _spec(
    tickets: dict[str, Any],
    run_id: str,
    pretrained: str,
    deepspeed: dict[str, Any] | None = None,
    **hyperparameters: Any,
) -> TrainSpec:
    return TrainSpec(
        config=_config(tickets["root"], pretrained, deepspeed, **hyperparameters),
        run_id=run_id,
        data_files=tickets["files"],
    )


def _hf_directory(result: dict[str, Any], into: Path) -> Path:
    """The logged model's Hugging Face directory, where its MLmodel says it is."""
    local = Path(mlflow.artifacts.download_artifacts(result["model_uri"], dst_path=str(into)))
    model = mlflow.models.Model.load(str(local / "MLmodel"))
    return local / model.flavors["python_function"]["artifacts"]["hf"]["path"]


@pytest.fixture(scope="module")
def nearly_frozen(tickets: dict[str, Any]) -> JobRun:
    """Two steps at a learning rate of 1e-9: what it registers is what it started from."""
    run = run_job(
        _spec(tickets, "nearly_frozen", tickets["encoder"].as_uri(), learning_rate=1e-9, max_steps=2)
    )
    assert run.code == 0, run.text[-4000:]
    return run


def test_saving_the_directory_prints_no_progress_bar_into_the_log(nearly_frozen: JobRun) -> None:
    # A task log is a file: transformers' "Writing model shards" bar printed a line per refresh.
    assert nearly_frozen.result is not None and nearly_frozen.result["model_uri"]  # it saved one
    assert "Writing model shards" not in nearly_frozen.text, nearly_frozen.text[-4000:]


def test_the_job_starts_from_the_pretrained_weights_and_registers_a_directory_transformers_loads(
    tickets: dict[str, Any], nearly_frozen: JobRun, tmp_path: Path
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    assert nearly_frozen.result is not None
    exported = _hf_directory(nearly_frozen.result, tmp_path)
    pretrained = load_file(str(tickets["encoder"] / "model.safetensors"))
    fine_tuned = load_file(str(exported / "model.safetensors"))
    torch.manual_seed(0)
    fresh = AutoModel.from_config(AutoConfig.from_pretrained(str(tickets["encoder"]))).state_dict()
    compared = [k for k in pretrained if not k.startswith("pooler.")]
    assert compared and all(k in fine_tuned for k in compared)
    for key in compared:
        # AdamW moves a weight by about the learning rate per step: 2e-9 from where it started.
        np.testing.assert_allclose(fine_tuned[key], pretrained[key], atol=1e-7, rtol=0, err_msg=key)
    assert any(not torch.allclose(fresh[k], pretrained[k], atol=1e-3) for k in compared if "weight" in k)
    # transformers reads the directory directly: the encoder and the tokenizer it was trained with.
    encoder = AutoModel.from_pretrained(str(exported), local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(str(exported), local_files_only=True)
    encoded = tokenizer(["my package never arrived"], return_tensors="pt")
    assert encoder(**encoded).last_hidden_state.shape[-1] == 32
    # The pin is lineage: the run's tags name the bytes.
    run = mlflow.get_run(nearly_frozen.result["mlflow_run_id"])
    digests = PretrainedDirectory(tickets["encoder"], "x").file_digests()
    assert run.data.tags["trainpipe.pretrained_sha256"] == directory_sha256(digests)
    assert run.data.tags["trainpipe.pretrained_source"] == tickets["encoder"].as_uri()
    spec = mlflow.artifacts.load_dict(f"runs:/{run.info.run_id}/spec.json")
    assert spec["pretrained"]["sha256"] == directory_sha256(digests)
    assert nearly_frozen.result["pretrained"] == {
        "uri": tickets["encoder"].as_uri(),
        "source": tickets["encoder"].as_uri(),
        "sha256": directory_sha256(digests),
    }  # the train task's OpenLineage input (openlineage/lineage.training)


def test_zero3_builds_the_encoder_partitioned(nearly_frozen: JobRun) -> None:
    line = next(line for line in nearly_frozen.output if "model built:" in line)
    assert "partitioned as built: this rank holds" in line, line


def test_the_registered_model_serves_raw_text_as_the_job_scored_it(
    tickets: dict[str, Any], nearly_frozen: JobRun, trainpipe_home: Path, tmp_path: Path
) -> None:
    result = nearly_frozen.result
    assert result is not None
    version = mlflow.register_model(result["model_uri"], MODEL_NAME).version
    mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", version)
    logged = mlflow.artifacts.load_dict(f"runs:/{result['mlflow_run_id']}/holdout_predictions.json")
    rows = holdout_rows(tickets["files"], _config(tickets["root"], "x").data, logged["rows"])
    served = served_in_a_fresh_interpreter(
        f"models:/{MODEL_NAME}@champion", rows, f"sqlite:///{trainpipe_home / 'mlflow.db'}", tmp_path
    )
    np.testing.assert_allclose(served, np.array(logged["predictions"]), rtol=1e-5, atol=1e-6)


def test_fine_tuning_from_the_champion_starts_from_the_whole_champion(
    tickets: dict[str, Any], nearly_frozen: JobRun
) -> None:
    champion = mlflow.MlflowClient().get_model_version_by_alias(MODEL_NAME, "champion")  # the test above's
    run = run_job(
        _spec(tickets, "from_champion", f"models:/{MODEL_NAME}@champion", learning_rate=1e-9, max_steps=2)
    )
    assert run.code == 0, run.text[-4000:]
    assert run.result is not None and nearly_frozen.result is not None
    tags = mlflow.get_run(run.result["mlflow_run_id"]).data.tags
    assert (
        tags["trainpipe.pretrained_source"] == f"models:/{MODEL_NAME}/{champion.version}"
    )  # the alias, pinned
    assert tags["trainpipe.pretrained_uri"] == f"models:/{MODEL_NAME}@champion"
    # Encoder and head are the champion's: the holdout scores are the champion's (to 1e-9 steps).
    for name, value in nearly_frozen.result["holdout_metrics"].items():
        assert run.result["holdout_metrics"][name] == pytest.approx(value, abs=1e-6), name
    first = mlflow.artifacts.load_dict(
        f"runs:/{nearly_frozen.result['mlflow_run_id']}/holdout_predictions.json"
    )
    second = mlflow.artifacts.load_dict(f"runs:/{run.result['mlflow_run_id']}/holdout_predictions.json")
    np.testing.assert_allclose(second["predictions"], first["predictions"], atol=1e-6)


@pytest.fixture(scope="module")
def s3_encoder(tickets: dict[str, Any], s3_endpoint: str) -> str:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    for file in tickets["encoder"].iterdir():
        client.upload_file(str(file), "trainpipe", f"encoders/small/{file.name}")
    return "s3://trainpipe/encoders/small"


@pytest.fixture(scope="module")
def uninterrupted(tickets: dict[str, Any]) -> JobRun:
    run = run_job(_spec(tickets, "uninterrupted", tickets["encoder"].as_uri()))
    assert run.code == 0, run.text[-4000:]
    return run


@pytest.fixture(scope="module")
def killed_on_s3(tickets: dict[str, Any], s3_encoder: str) -> tuple[TrainSpec, JobRun, Path]:
    """A 2-rank job on the S3 directory SIGKILLed at step 8, past its step-5 checkpoint: (its spec,
    the killed run, a copy of the run directory as the kill left it). The S3 test retries it on 2
    ranks; the world-size test resumes the copy on one."""
    spec = _spec(tickets, "s3_resumed", s3_encoder)
    killed = run_job(spec, pause_at="step:8")
    snapshot = tickets["root"] / "killed_on_s3_snapshot"
    shutil.copytree(local_path(spec.run_dir), snapshot)
    return spec, killed, snapshot


def test_a_killed_job_on_an_s3_directory_resumes_bit_exact_from_its_pin(
    killed_on_s3: tuple[TrainSpec, JobRun, Path], s3_encoder: str, uninterrupted: JobRun
) -> None:
    spec, killed, _ = killed_on_s3
    assert killed.code != 0 and killed.result is None
    pin = json.loads(Path(spec.run_dir.removeprefix("file://"), "pretrained.json").read_text())
    assert pin["source"] == s3_encoder and pin["sha256"]
    copy = node_directory(s3_encoder)
    fetched_at = (copy / "model.safetensors").stat().st_mtime_ns
    retry = run_job(spec)
    assert retry.code == 0, retry.text[-4000:]
    assert retry.result is not None and retry.result["resumed_from_step"] == 5
    # The same bytes from S3 as from the local directory: the same model, bit for bit.
    assert uninterrupted.result is not None
    assert retry.result["weights_sha256"] == uninterrupted.result["weights_sha256"]
    # The retry read this node's copy again, checked against the pin, without downloading it.
    assert (copy / "model.safetensors").stat().st_mtime_ns == fetched_at


def test_a_zero3_checkpoint_of_a_fine_tune_resumes_on_another_world_size(
    tickets: dict[str, Any], killed_on_s3: tuple[TrainSpec, JobRun, Path], uninterrupted: JobRun
) -> None:
    # The 2-rank job's ZeRO-3 checkpoint (torchrun's 2 ranks wrote it, SIGKILLed at step 8), resumed
    # on a copy of its run directory as a fresh MLflow run.
    spec, killed, snapshot = killed_on_s3
    assert killed.code != 0
    spec = spec.model_copy(update={"run_id": "one_rank_resume"})
    shutil.copytree(snapshot, local_path(spec.run_dir))
    (local_path(spec.run_dir) / RUN_ID_FILE).unlink()
    # One rank forked from the warm parent, as a one-rank CPU job runs (launchers/runner.py): the
    # ranks that matter are the two that partitioned the checkpoint this one rank reads whole.
    resumed = run_job(spec, nproc=1, forked=True)
    assert resumed.code == 0, resumed.text[-4000:]
    assert resumed.result is not None and resumed.result["world_size"] == 1
    assert resumed.result["resumed_from_step"] == 5
    for step, loss in resumed.losses.items():
        assert loss == pytest.approx(uninterrupted.losses[step], abs=1e-5), f"step {step}"


def test_a_pickled_directory_fails_the_job_before_any_step_and_says_not_to_retry(
    tickets: dict[str, Any], tmp_path: Path
) -> None:
    bad = Path(shutil.copytree(tickets["encoder"], tmp_path / "pickled"))
    (bad / "pytorch_model.bin").write_bytes(b"\x80\x04never unpickled")
    run = run_job(_spec(tickets, "pickled", bad.as_uri()), 1, forked=True)  # refused before any rank trains
    assert run.code != 0 and run.start is None and not run.losses
    errors = [
        json.loads(line.split("TRAINPIPE ", 1)[1])
        for line in run.output
        if 'TRAINPIPE {"event": "error"' in line
    ]
    assert errors and all(e["retryable"] is False for e in errors), errors
    assert (
        f"pretrained directory {bad.as_uri()}: holds pickled weights (pytorch_model.bin)"
        in errors[0]["error"]
    )


def test_zero3_with_optimizer_and_parameters_offloaded_to_cpu_trains_as_without(
    tickets: dict[str, Any], uninterrupted: JobRun
) -> None:
    offload = {"offload_optimizer": "cpu", "offload_params": "cpu"}
    run = run_job(_spec(tickets, "offloaded", tickets["encoder"].as_uri(), offload, max_steps=8))
    assert run.code == 0, run.text[-4000:]
    assert run.result is not None and run.result["final_step"] == 8
    assert sorted(run.losses) and all(step in uninterrupted.losses for step in run.losses)
    for step, loss in run.losses.items():
        assert loss == pytest.approx(uninterrupted.losses[step], abs=1e-5), f"step {step}"


def test_bf16_on_cpu_ranks_with_activation_checkpointing_trains_and_registers_fp32_weights(
    tickets: dict[str, Any], tmp_path: Path, uninterrupted: JobRun
) -> None:
    from safetensors import safe_open

    spec = _spec(tickets, "bf16", tickets["encoder"].as_uri(), {"precision": "bf16"}, max_steps=4)
    config = spec.config.model_copy(
        update={"training": spec.config.training.model_copy(update={"activation_checkpointing": True})}
    )
    run = run_job(spec.model_copy(update={"config": config}))
    assert run.code == 0, run.text[-4000:]
    assert run.result is not None and run.result["final_step"] == 4
    # Both really on in the engine that trained, not only asked for in the config.
    assert run.start is not None and run.start["dtype"] == "bfloat16", run.start
    assert run.start["activation_checkpointing"] is True
    assert uninterrupted.start is not None  # the same pipeline as configured: neither
    assert (uninterrupted.start["dtype"], uninterrupted.start["activation_checkpointing"]) == (
        "float32",
        False,
    )
    params = mlflow.get_run(run.result["mlflow_run_id"]).data.params
    assert params["deepspeed_config.bf16.enabled"] == "True"
    assert all(np.isfinite(loss) for loss in run.losses.values())
    with safe_open(str(_hf_directory(run.result, tmp_path) / "model.safetensors"), framework="pt") as handle:
        assert {handle.get_slice(k).get_dtype() for k in handle.keys()} == {"F32"}  # noqa: SIM118
