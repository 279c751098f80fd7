"""`training.speed`: the training step's levers, one switch each (docs/speed.md).

Each switch names one thing the step does differently, so that its gain can be measured alone
(`benchmarks/gpu_levers.py` runs the job once per lever). `auto` values are resolved per rank,
once the job knows whether it has a GPU (`SpeedSection.for_rank`): a config is written once and trains
on a laptop's CPU and on a GPU node. A value that only a GPU can run is refused by the loader when
the config asks for no GPU, and by the job on a rank that has none.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from airflow_trainpipe.config.base import FieldProblems, Section

CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")


class SpeedSection(Section):
    """How the training step runs; none of these change what is learned beyond float rounding."""

    optimizer: Literal["auto", "foreach", "fused"] = "auto"
    """AdamW's kernels: `fused` updates a whole parameter group in one kernel (torch's
    `fused=True`), `foreach` in a few multi-tensor kernels per group. `auto`: fused on GPU ranks
    (the HF Trainer's choice there), foreach on CPU ranks. Offloaded optimizer state on GPU nodes
    steps with DeepSpeed's CPU Adam whatever this says."""

    attention: Literal["auto", "eager", "sdpa", "flash_attention_2"] = "auto"
    """The text encoder's attention kernel (transformers' `attn_implementation`): `sdpa` is torch's
    scaled_dot_product_attention (fused kernels), `eager` the plain matrix products,
    `flash_attention_2` the flash-attn package's kernels (GPU ranks with flash-attn installed).
    `auto`: transformers' default, sdpa. text_encoder only."""

    compile: Literal["none", "default", "reduce-overhead", "max-autotune"] = "none"
    """torch.compile the model with this mode (DeepSpeed's `engine.compile`): `default` fuses its
    kernels (GPU and CPU ranks); `reduce-overhead` also replays CUDA graphs, `max-autotune` also
    searches kernel configurations (GPU ranks only). Compiling costs start-up time (tens of
    seconds), and text is then padded to a multiple of 16 tokens so that few shapes are compiled."""

    fused_qkv: bool = False
    """Text encoders: each self-attention's query, key and value projections made one, three times
    as wide (one matrix product instead of three, two parameter tensors instead of six per layer).
    Only the training engine's model is fused: checkpoints, the final weights and the logged
    model keep transformers' names and shapes. BERT-style attention (BERT, RoBERTa, ELECTRA,
    ...); ZeRO stages 0-2. A run resumes with the value it was checkpointed with."""

    immediate_grad_update: bool = False
    """bf16 with ZeRO-1: gradients accumulate in fp32 (`data_types.grad_accum_dtype`), which makes
    DeepSpeed step with its bf16 optimizer instead of its ZeRO one, and that optimizer adds each
    gradient into its fp32 copy as the backward pass produces it, instead of in a pass over every
    parameter tensor at the step. Without bf16 (fp32 on CPU ranks under `precision: auto`) it does
    nothing."""

    group_by_length: bool = False
    """With `gradient_accumulation_steps` > 1: each step's rows on a rank are sorted by text
    length before they are cut into micro-batches, so each micro-batch is padded to its own rows'
    width and less padding is computed. A step trains on the same rows and its gradient is their
    mean as before; only which rows share a micro-batch changes (and with it float rounding and
    dropout draws)."""

    packing: bool = False
    """Text models: each micro-batch's texts packed one after another into as few rows as fit (the
    micro-batch's longest text wide), with positions restarting at each text and a block-diagonal
    attention mask, so the encoder computes on tokens rather than padding. Each text's [CLS] state
    is the one it has alone, up to float rounding. Encoders whose masks transformers' masking_utils
    build (BERT, RoBERTa, DistilBERT, ELECTRA, ...) with `attention` sdpa or eager."""

    data_on_device: bool = False
    """Copy each chunk of encoded training rows to the GPU once, as it is loaded (the encoded cache,
    `data.encoded_cache_mib`, once and whole), and cut the micro-batches there, instead of copying
    every micro-batch from pinned host memory. Off until a GPU run has measured it: it holds up to
    the cache's size in GPU memory. On CPU ranks the rows are in the device's memory already:
    `true` is refused there."""

    def problems(self, on_gpu_nodes: bool, gradient_accumulation_steps: int) -> FieldProblems:
        """What this section asks that the job cannot do: GPU-only values without GPUs, grouping
        without micro-batches to group."""
        found: FieldProblems = []
        if not on_gpu_nodes:
            for loc, message in gpu_only(self):
                found.append((loc, f"{message}; the config asks for no GPU (resources.gpus_per_node 0)"))
        if self.packing and self.attention == "flash_attention_2":
            found.append(
                (
                    ("packing",),
                    "packed rows need a block-diagonal 4D attention mask, which flash_attention_2 "
                    "does not read; use attention sdpa (or auto) with packing",
                )
            )
        if self.group_by_length and gradient_accumulation_steps < 2:
            found.append(
                (
                    ("group_by_length",),
                    "needs hyperparameters.gradient_accumulation_steps of 2 or more: it sorts a "
                    "step's rows between its micro-batches, and one micro-batch has none to sort",
                )
            )
        return found

    def for_rank(self, on_gpu: bool) -> SpeedLevers:
        """The levers a rank runs with, `auto` resolved for a GPU rank or a CPU one. Raises
        ValueError naming every GPU-only value when `on_gpu` is False."""
        refused = gpu_only(self) if not on_gpu else []
        if refused:
            raise ValueError(
                "this rank has no GPU, and training.speed asks for what only a GPU runs: "
                + "; ".join(f"training.speed.{'.'.join(map(str, loc))}: {msg}" for loc, msg in refused)
            )
        return SpeedLevers(
            fused_optimizer=self.optimizer == "fused" or (self.optimizer == "auto" and on_gpu),
            attention=None if self.attention == "auto" else self.attention,
            compile_mode=None if self.compile == "none" else self.compile,
            fused_qkv=self.fused_qkv,
            immediate_grad_update=self.immediate_grad_update,
            group_by_length=self.group_by_length,
            packing=self.packing,
            data_on_device=self.data_on_device,
        )


def gpu_only(speed: SpeedSection) -> FieldProblems:
    """The values of `speed` that only a GPU rank can run, each with why."""
    found: FieldProblems = []
    if speed.attention == "flash_attention_2":
        found.append((("attention",), "flash_attention_2 runs flash-attn's CUDA kernels; use sdpa or auto"))
    if speed.compile in CUDA_GRAPH_MODES:
        found.append((("compile",), f"{speed.compile} replays CUDA graphs; use default"))
    if speed.data_on_device:
        found.append(
            (("data_on_device",), "CPU ranks hold the rows in the device's memory already; use false")
        )
    return found


@dataclass(frozen=True)
class SpeedLevers:
    """`training.speed` as one rank runs it: every `auto` resolved."""

    fused_optimizer: bool
    attention: str | None
    """transformers' `attn_implementation`; None: its default."""
    compile_mode: str | None
    """torch.compile's mode; None: not compiled."""
    fused_qkv: bool
    immediate_grad_update: bool
    group_by_length: bool
    packing: bool
    data_on_device: bool
