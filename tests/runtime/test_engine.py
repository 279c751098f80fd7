from __future__ import annotations

from airflow_trainpipe.config import load_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.runtime.engine import deepspeed_config
from tests.conftest import EXAMPLE_CONFIGS


def test_run_overrides_reach_the_deepspeed_config() -> None:
    config = load_config(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    spec = TrainSpec(
        config=config,
        run_id="r",
        data_files=["file:///x.parquet"],
        hyperparameters=config.training.hyperparameters.with_overrides({"gradient_accumulation_steps": 2}),
    )
    ds = deepspeed_config(spec, global_batch=1024, world_size=2, universal=False, on_gpu=False)
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["train_micro_batch_size_per_gpu"] == 256  # 1024 / 2 accumulation / 2 ranks
    assert ds["zero_optimization"]["stage"] == 1 and ds["bf16"]["enabled"] is False
