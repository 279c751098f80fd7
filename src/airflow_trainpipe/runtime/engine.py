"""The DeepSpeed engine of a training job: its config, construction, and what is read off it.

Importing this module imports DeepSpeed, which picks its accelerator when first imported, so
the CPU accelerator is chosen here, before that import, on a machine without CUDA.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
    os.environ["DS_ACCELERATOR"] = "cpu"

import deepspeed

from airflow_trainpipe.config.speed import SpeedLevers
from airflow_trainpipe.config.training import Hyperparameters
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.exceptions import TrainpipeError

PREDICT_BATCH = 4096


def deepspeed_config(
    spec: TrainSpec, global_batch: int, world_size: int, *, universal: bool, on_gpu: bool
) -> dict[str, Any]:
    """From the config's `training.deepspeed` and the run's effective hyperparameters."""
    hp, ds = spec.hyperparameters, spec.config.training.deepspeed
    precision = ds.precision
    if precision == "auto":
        precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if on_gpu else "fp32"
    zero: dict[str, Any] = {"stage": ds.zero_stage}
    if ds.offload_optimizer != "none":
        zero["offload_optimizer"] = {
            "device": ds.offload_optimizer,
            **({"nvme_path": ds.nvme_path} if ds.offload_optimizer == "nvme" else {}),
        }
    if ds.offload_params != "none":
        zero["offload_param"] = {
            "device": ds.offload_params,
            **({"nvme_path": ds.nvme_path} if ds.offload_params == "nvme" else {}),
        }
    config: dict[str, Any] = {
        "train_batch_size": global_batch,
        "train_micro_batch_size_per_gpu": global_batch // hp.gradient_accumulation_steps // world_size,
        "gradient_accumulation_steps": hp.gradient_accumulation_steps,
        "gradient_clipping": ds.gradient_clipping,
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        # A torch optimizer instance is passed in, so ZeRO must accept a "client" optimizer.
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1 << 62,
        "checkpoint": {"load_universal": universal},
    }
    if precision == "bf16" and spec.config.training.speed.immediate_grad_update:
        # Only DeepSpeed's bf16 optimizer has it, and ZeRO-1 picks that one only when gradients
        # accumulate in fp32 (otherwise its ZeRO optimizer steps bf16 gradient partitions).
        config["bf16"]["immediate_grad_update"] = True
        config["data_types"] = {"grad_accum_dtype": "fp32"}
    if ds.offload_optimizer != "none" and not on_gpu:
        # CPU ranks: the optimizer runs on this CPU either way, so torch's AdamW steps the
        # offloaded partitions (DeepSpeedCPUAdam, the GPU nodes' choice, is a C++ op built on
        # first use: minutes on 2 cores, for no gain here).
        config["zero_force_ds_cpu_optimizer"] = False
    return _merge(config, ds.overrides)


def _merge(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        merged[key] = (
            _merge(merged[key], value)
            if isinstance(value, dict) and isinstance(merged.get(key), dict)
            else value
        )
    return merged


def compute_dtype(ds_config: dict[str, Any]) -> torch.dtype:
    if ds_config["bf16"]["enabled"]:
        return torch.bfloat16
    return torch.float16 if ds_config["fp16"]["enabled"] else torch.float32


def lr_factor(hp: Hyperparameters, total_steps: int, fine_tuning: bool = False) -> Callable[[int], float]:
    """The learning rate's multiplier at each optimizer step (0-based, as LambdaLR counts): a
    linear warm-up to 1, then the configured decay to `min_lr_ratio` at the run's last step.

    A function of the step and the run's step count alone, both fixed for a run (a resumed or
    re-sized job keeps its global batch): a retry and `trainpipe reproduce` follow the same curve."""
    warmup = max(hp.warmup_steps, math.ceil(hp.warmup_ratio * total_steps))
    floor, schedule = hp.min_lr_ratio, hp.schedule(fine_tuning)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        decay_steps = max(total_steps - warmup, 1)
        done = min((step - warmup) / decay_steps, 1.0)  # as the HF Trainer's schedules count
        shape = 1.0 - done if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return floor + (1.0 - floor) * shape

    return factor


def build_engine(
    model: torch.nn.Module,
    spec: TrainSpec,
    ds_config: dict[str, Any],
    schedule: Callable[[int], float],
    levers: SpeedLevers | None = None,
) -> Any:
    """AdamW whose rate follows `schedule` (`lr_factor`'s multiplier per step), under DeepSpeed
    (ZeRO, precision, offload from `ds_config`), with `levers`' optimizer kernels and compilation
    (None: torch's defaults, not compiled)."""
    hp = spec.hyperparameters
    if levers is not None and levers.fused_qkv:
        _fuse_attention(model)  # before the optimizer takes the parameters
    offloaded = "offload_optimizer" in ds_config["zero_optimization"]
    if offloaded and ds_config.get("zero_force_ds_cpu_optimizer", True):
        # ZeRO-Offload on GPU nodes: the optimizer steps in host memory, where DeepSpeed's
        # vectorised CPU Adam (AdamW mode) is what DeepSpeed accepts and what makes it fast.
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        optimizer: torch.optim.Optimizer = DeepSpeedCPUAdam(
            model.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay, adamw_mode=True
        )
    else:
        # fused=None is torch's own choice: foreach on GPUs, a loop over tensors on CPUs.
        fused = True if levers is not None and levers.fused_optimizer else None
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay, fused=fused
        )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=ds_config
    )
    if levers is not None and levers.compile_mode is not None:
        mode = levers.compile_mode
        engine.compile(compile_kwargs={} if mode == "default" else {"mode": mode})
    return engine


def _fuse_attention(model: torch.nn.Module) -> None:
    from airflow_trainpipe.runtime.models.fused_qkv import FusionMismatch, fuse_qkv

    try:
        fused = fuse_qkv(model)
    except FusionMismatch as exc:
        raise TrainpipeError(f"training.speed.fused_qkv: {exc}; set it false") from None
    if fused == 0:
        raise TrainpipeError(
            f"training.speed.fused_qkv: the model ({type(model).__name__}) has no BERT-style "
            "self-attention (query, key and value projections) to fuse; set it false"
        )


def speed_in_force(engine: Any) -> dict[str, Any]:
    """What the engine runs, read off it rather than the config: a test (or a user) sees that a
    lever is really on, not only asked for."""
    from airflow_trainpipe.runtime.models.fused_qkv import fused_modules

    module = getattr(engine, "module", engine)
    optimizer = getattr(engine, "basic_optimizer", None)
    kernels = {
        str(m.config._attn_implementation)
        for m in module.modules()
        if hasattr(getattr(m, "config", None), "_attn_implementation")  # transformers' models
    }
    return {
        "fused_optimizer": bool(optimizer is not None and optimizer.defaults.get("fused")),
        "attention": ",".join(sorted(kernels)) or None,
        "compiled": bool(getattr(engine, "is_compiled", False)),
        "fused_qkv": fused_modules(module) > 0,
        "immediate_grad_update": bool(
            getattr(getattr(engine, "optimizer", None), "immediate_grad_update", False)
        ),
    }


def input_dtype(engine: Any, dtype: torch.dtype) -> torch.dtype:
    """The dtype input rows are handed over in: float32 to a mapping model (`MappedInputs` keeps
    codes and token ids exact and casts the dense block itself), the compute dtype otherwise."""
    module = getattr(engine, "module", engine)  # a DeepSpeed engine wraps the model; a bare module is it
    return torch.float32 if getattr(module, "keeps_float32_inputs", False) else dtype


def predict(engine: Any, x: np.ndarray, device: torch.device, dtype: torch.dtype) -> np.ndarray:
    """Raw network outputs; every rank runs the same batches (ZeRO-3 gathers parameters inside forward)."""
    engine.eval()
    outputs = []
    dtype = input_dtype(engine, dtype)
    with torch.no_grad():
        for start in range(0, len(x), PREDICT_BATCH):
            chunk = torch.from_numpy(x[start : start + PREDICT_BATCH]).to(device, dtype)
            outputs.append(engine(chunk).float().squeeze(1).cpu())
    engine.train()
    return torch.cat(outputs).numpy().astype(np.float64)


@contextmanager
def model_construction(ds_config: dict[str, Any]) -> Iterator[None]:
    """Where the model is built. Under ZeRO-3, partitioned as it is built (`deepspeed.zero.Init`):
    each module's parameters are cut into this rank's shard as soon as that module exists, so no
    rank ever holds the whole model, and a pretrained encoder is loaded a layer at a time into its
    shards (transformers' DeepSpeed integration, which `from_pretrained` reads while the
    HfDeepSpeedConfig lives). Other stages build the whole model as before."""
    if ds_config["zero_optimization"]["stage"] != 3:
        yield
        return
    # zero.Init patches torch.Tensor.__new__ while it is active; torch._dynamo, which transformers
    # imports lazily (a @torch.compiler.disable at module level), refuses to load under the patch.
    import torch._dynamo  # noqa: F401
    from transformers.integrations import HfDeepSpeedConfig
    from transformers.integrations.deepspeed import unset_hf_deepspeed_config

    integration = HfDeepSpeedConfig(ds_config)  # read through a weak reference: kept alive here
    try:
        with deepspeed.zero.Init(config_dict_or_path=ds_config):
            yield
    finally:
        # Later builds (the rank-0 copy the run logs) are whole models again.
        unset_hf_deepspeed_config()
        del integration


def full_state_dict(engine: Any, zero_stage: int) -> dict[str, torch.Tensor]:
    """Collective: the whole model's weights on rank 0 as fp32 tensors (the other ranks get {}).
    They are the module's own values, what the job scores and logs alike: under bf16 its bf16
    weights widened, not the optimizer's fp32 master copy (which ZeRO-1/2 shard across ranks and
    fused_qkv would need split as `_split_on_save` splits the module's). ZeRO-3 gathers one
    parameter at a time, so no device ever holds more than the largest one beside its shard;
    rank 0's host memory gets the consolidated copy."""
    module = engine.module
    if zero_stage != 3:
        if dist.get_rank() != 0:
            return {}
        return {k: v.detach().float().cpu().clone() for k, v in module.state_dict().items()}
    weights: dict[str, torch.Tensor] = {}
    for name, parameter in module.named_parameters():
        with deepspeed.zero.GatheredParameters([parameter], modifier_rank=None):
            if dist.get_rank() == 0:
                weights[name] = parameter.detach().float().cpu().clone()
    if dist.get_rank() != 0:
        return {}
    # Buffers are not partitioned. The state dict's order and names are the module's (its ZeRO-3
    # parameter entries are empty placeholders: only its keys are read).
    buffers = {k: v.detach().float().cpu().clone() for k, v in module.named_buffers()}
    return {k: weights[k] if k in weights else buffers[k] for k in module.state_dict()}


def weights_sha256(weights: dict[str, torch.Tensor]) -> str:
    """Identity of a set of weights: same names and bytes, same digest (the bit-exact check)."""
    digest = hashlib.sha256()
    for key in sorted(weights):
        digest.update(key.encode())
        digest.update(weights[key].numpy().tobytes())
    return digest.hexdigest()
