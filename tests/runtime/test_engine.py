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


def _hf_factors(name: str, warmup: int, total: int, **kwargs: float) -> list[float]:
    """The multipliers of the Hugging Face Trainer's own schedule (transformers.optimization)."""
    import torch
    from transformers import optimization

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = getattr(optimization, name)(optimizer, warmup, total, **kwargs)
    return [scheduler.lr_lambdas[0](step) for step in range(total)]


def test_the_schedules_follow_the_hf_trainers_with_warmup_ratio_and_floor() -> None:
    import pytest

    from airflow_trainpipe.config.training import Hyperparameters
    from airflow_trainpipe.runtime.engine import lr_factor

    # After the warm-up, the HF Trainer's curves; the warm-up itself starts at 1/warmup, not at 0
    # (HF's first step has no learning rate at all), as trainpipe's warm-up always did.
    total = 50
    linear = lr_factor(Hyperparameters(warmup_ratio=0.1, lr_schedule="linear"), total)
    assert [linear(s) for s in range(5)] == pytest.approx([0.2, 0.4, 0.6, 0.8, 1.0])
    assert [linear(s) for s in range(5, total)] == pytest.approx(
        _hf_factors("get_linear_schedule_with_warmup", 5, total)[5:]
    )
    cosine = lr_factor(Hyperparameters(warmup_steps=3, lr_schedule="cosine", min_lr_ratio=0.1), total)
    assert [cosine(s) for s in range(3, total)] == pytest.approx(
        _hf_factors("get_cosine_with_min_lr_schedule_with_warmup", 3, total, min_lr_rate=0.1)[3:]
    )
    # The larger warm-up wins; constant keeps the rate after it.
    constant = lr_factor(Hyperparameters(warmup_steps=2, warmup_ratio=0.2, lr_schedule="constant"), total)
    assert [constant(s) for s in range(12)] == pytest.approx([(s + 1) / 10 for s in range(10)] + [1.0, 1.0])


def test_auto_decays_a_fine_tune_and_keeps_a_from_scratch_rate_constant() -> None:
    import pytest

    from airflow_trainpipe.config.training import Hyperparameters
    from airflow_trainpipe.runtime.engine import lr_factor

    auto = Hyperparameters()
    assert auto.lr_schedule == "auto"
    assert [lr_factor(auto, 10)(s) for s in range(10)] == [1.0] * 10
    assert [lr_factor(auto, 10, fine_tuning=True)(s) for s in range(10)] == pytest.approx(
        [1.0 - s / 10 for s in range(10)]
    )
