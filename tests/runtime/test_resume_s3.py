"""The training job on s3://: data read from and checkpoints uploaded to a moto S3 server on 127.0.0.1."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.synthetic import write_day
from airflow_trainpipe.train_spec import TrainSpec
from tests.jobs import job_config, run_job, uninterrupted_run

pytestmark = pytest.mark.slow


def test_s3_data_and_async_checkpoints_resume_bit_exact(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, trainpipe_home: Path,
                                                       job_files: list[str], s3_endpoint: str) -> None:
    import boto3

    # The same bytes as the local fixture: the S3 run must reproduce the local run's losses exactly.
    files = write_day("s3://trainpipe/data", date(2026, 1, 1), 1200, seed=5)
    config = job_config(tmp_path)
    config = config.model_copy(update={"training": config.training.model_copy(update={
        "checkpoint": config.training.checkpoint.model_copy(update={"uri": "s3://trainpipe/checkpoints"})})})
    assert config.training.checkpoint.async_upload
    local = uninterrupted_run(tmp_path_factory, job_files)  # the same job on file://
    spec = TrainSpec(config=config, run_id="on_s3", data_files=files)
    assert run_job(spec, pause_at="step:25").code != 0
    resumed = run_job(spec)
    assert resumed.code == 0, resumed.text[-3000:]
    # Step 20's upload may not have its marker yet when the job dies; 19 (epoch end) always has.
    assert resumed.result["resumed_from_step"] in (19, 20)
    for step, loss in resumed.losses.items():
        assert loss == local.losses[step], f"step {step}"
    assert resumed.result["weights_sha256"] == local.result["weights_sha256"]
    keys = [o["Key"] for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(Bucket="trainpipe", Prefix="checkpoints/")["Contents"]]
    assert "checkpoints/fraud_detector/on_s3/result.json" in keys
    assert any(k.endswith("/COMPLETE.json") for k in keys)
