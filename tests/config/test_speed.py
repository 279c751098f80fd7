"""config.speed: the training step's levers, resolved per rank, refused where they cannot run."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.config.speed import SpeedSection
from airflow_trainpipe.core.exceptions import ConfigError
from tests.conftest import EXAMPLE_CONFIGS


def _config(name: str = "support_tickets.yaml", **training: Any):
    data = yaml.safe_load((EXAMPLE_CONFIGS / name).read_text())
    for key, value in training.items():
        if isinstance(value, dict) and isinstance(data["training"].get(key), dict):
            data["training"][key].update(value)
        else:
            data["training"][key] = value
    return parse_config(yaml.safe_dump(data), name)


def _refused(**training: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        _config(**training)
    return str(caught.value)


def test_the_defaults_are_resolved_for_a_gpu_rank_and_a_cpu_rank() -> None:
    speed = _config().training.speed
    on_gpu, on_cpu = speed.for_rank(True), speed.for_rank(False)
    assert (on_gpu.fused_optimizer, on_gpu.data_on_device) == (True, False)
    assert (on_cpu.fused_optimizer, on_cpu.data_on_device) == (False, False)
    for levers in (on_gpu, on_cpu):
        assert levers.attention is None and levers.compile_mode is None  # transformers' default; eager torch
        assert not (levers.immediate_grad_update or levers.group_by_length)


def test_explicit_values_win_over_auto_on_either_rank() -> None:
    speed = SpeedSection(optimizer="foreach", attention="eager", compile="default", data_on_device=False)
    levers = speed.for_rank(True)
    assert (levers.fused_optimizer, levers.attention, levers.compile_mode, levers.data_on_device) == (
        False,
        "eager",
        "default",
        False,
    )
    assert SpeedSection(optimizer="fused").for_rank(False).fused_optimizer


@pytest.mark.parametrize(
    ("speed", "where", "why"),
    [
        ({"attention": "flash_attention_2"}, "training.speed.attention", "flash-attn's CUDA kernels"),
        ({"compile": "reduce-overhead"}, "training.speed.compile", "CUDA graphs"),
        ({"compile": "max-autotune"}, "training.speed.compile", "CUDA graphs"),
        ({"data_on_device": True}, "training.speed.data_on_device", "in the device's memory already"),
    ],
)
def test_what_only_a_gpu_runs_is_refused_by_a_config_without_gpus(
    speed: dict[str, Any], where: str, why: str
) -> None:
    message = _refused(speed=speed)
    assert where in message and why in message and "gpus_per_node 0" in message
    accepted = _config(speed=speed, resources={"gpus_per_node": 1, "processes_per_node": 1})
    assert accepted.training.speed.for_rank(True) is not None


def test_a_cpu_rank_refuses_every_gpu_only_value_of_a_gpu_config_at_once() -> None:
    speed = SpeedSection(attention="flash_attention_2", compile="reduce-overhead", data_on_device=True)
    with pytest.raises(ValueError, match="this rank has no GPU") as caught:
        speed.for_rank(False)
    for field in ("speed.attention", "speed.compile", "speed.data_on_device"):
        assert f"training.{field}" in str(caught.value)


def test_grouping_by_length_needs_micro_batches_to_group_and_no_ranking_groups() -> None:
    assert "gradient_accumulation_steps of 2 or more" in _refused(speed={"group_by_length": True})
    grouped = _config(speed={"group_by_length": True}, hyperparameters={"gradient_accumulation_steps": 2})
    assert grouped.training.speed.for_rank(False).group_by_length
    ranking = _refused(
        name="search_ranking.yaml",
        speed={"group_by_length": True},
        hyperparameters={"gradient_accumulation_steps": 2},
    )
    assert "training.speed.group_by_length" in ranking and "ranking group" in ranking


def test_immediate_grad_update_is_bf16_zero_1s() -> None:
    assert "precision is fp32" in _refused(
        speed={"immediate_grad_update": True}, deepspeed={"precision": "fp32"}
    )
    assert "needs deepspeed.zero_stage 1" in _refused(
        speed={"immediate_grad_update": True}, deepspeed={"zero_stage": 2}
    )
    # auto: bf16 on GPUs, fp32 on CPU ranks, where it does nothing (runtime.engine.deepspeed_config)
    assert _config(speed={"immediate_grad_update": True}).training.speed.immediate_grad_update


def test_an_unknown_lever_or_value_is_located() -> None:
    assert "training.speed.fused" in _refused(speed={"fused": True})
    assert "training.speed.compile" in _refused(speed={"compile": "fast"})


def test_packing_needs_a_mask_kernel_that_reads_block_diagonal_masks() -> None:
    message = _refused(
        speed={"packing": True, "attention": "flash_attention_2"},
        resources={"gpus_per_node": 1, "processes_per_node": 1},
    )
    assert "training.speed.packing" in message and "flash_attention_2" in message
    assert _config(speed={"packing": True}).training.speed.for_rank(False).packing


def test_fused_qkv_runs_on_any_rank_below_zero_3() -> None:
    message = _refused(speed={"fused_qkv": True}, deepspeed={"zero_stage": 3})
    assert "training.speed.fused_qkv" in message and "needs deepspeed.zero_stage 0, 1 or 2" in message
    assert (
        _config(speed={"fused_qkv": True}, deepspeed={"zero_stage": 2})
        .training.speed.for_rank(False)
        .fused_qkv
    )
    assert not _config().training.speed.for_rank(True).fused_qkv  # off until a GPU run measures it
