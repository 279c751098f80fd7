"""The training job on s3://: data read from and checkpoints uploaded to a moto S3 server on 127.0.0.1."""

from __future__ import annotations

import json
import time
from datetime import date
from pathlib import Path

import pytest

from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.examples.synthetic import write_day
from tests.helpers.jobs import job_config, run_job, uninterrupted_run

pytestmark = pytest.mark.slow


def test_s3_data_and_async_checkpoints_resume_bit_exact(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    trainpipe_home: Path,
    job_files: list[str],
    s3_endpoint: str,
) -> None:
    import boto3
    import botocore.config
    import botocore.exceptions

    # The same bytes as the local fixture: the S3 run must reproduce the local run's losses exactly.
    files = write_day("s3://trainpipe/data", date(2026, 1, 1), 1200, seed=5)
    config = job_config(tmp_path)
    config = config.model_copy(
        update={
            "training": config.training.model_copy(
                update={
                    "checkpoint": config.training.checkpoint.model_copy(
                        update={"uri": "s3://trainpipe/checkpoints"}
                    )
                }
            )
        }
    )
    assert config.training.checkpoint.async_upload
    local = uninterrupted_run(tmp_path_factory, job_files)  # the same job on file://
    spec = TrainSpec(config=config, run_id="on_s3", data_files=files)
    # Short timeouts: one slow answer on a loaded machine must not eat the whole wait.
    probe = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        config=botocore.config.Config(connect_timeout=2, read_timeout=2, retries={"max_attempts": 1}),
    )

    def mark_uploaded() -> None:
        # The step high-water mark reaches the run directory from a background upload; wait for
        # step 25's so the kill lands after it (the documented lag is one upload).
        key = "checkpoints/fraud_detector/on_s3/step_high_water.json"
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if json.loads(probe.get_object(Bucket="trainpipe", Key=key)["Body"].read())["step"] == 25:
                    return
            except (
                probe.exceptions.NoSuchKey,
                botocore.exceptions.ReadTimeoutError,
                botocore.exceptions.ConnectTimeoutError,
            ):
                pass
            time.sleep(0.1)
        raise AssertionError("step 25 never reached the run directory's step_high_water.json")

    store = {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}"}
    assert run_job(spec, pause_at="step:25", before_kill=mark_uploaded, env=store).code != 0
    # The retry runs in a new pod: another node-local disk, the same MLflow store and bucket.
    resumed = run_job(spec, env={**store, "TRAINPIPE_HOME": str(tmp_path / "new_pod")})
    assert resumed.code == 0, resumed.text[-3000:]
    # Step 20's upload may not have its marker yet when the job dies; 19 (epoch end) always has.
    assert resumed.result["resumed_from_step"] in (19, 20)
    # Steps 20..25 (or 21..25) are run again, counted from the mark in the run directory.
    assert resumed.result["steps_recomputed"] == 25 - resumed.result["resumed_from_step"]
    for step, loss in resumed.losses.items():
        assert loss == local.losses[step], f"step {step}"
    assert resumed.result["weights_sha256"] == local.result["weights_sha256"]
    keys = [
        o["Key"]
        for o in boto3.client("s3", endpoint_url=s3_endpoint).list_objects_v2(
            Bucket="trainpipe", Prefix="checkpoints/"
        )["Contents"]
    ]
    assert "checkpoints/fraud_detector/on_s3/result.json" in keys
    assert any(k.endswith("/COMPLETE.json") for k in keys)
