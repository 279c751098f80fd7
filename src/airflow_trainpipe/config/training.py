"""`training`: the model, its hyperparameters, DeepSpeed, resources, launcher and checkpoints."""

from __future__ import annotations

import json
import math
import posixpath
import re
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import (
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from airflow_trainpipe.config.base import FieldProblems, Section, field_problems
from airflow_trainpipe.config.catalog import BUILTIN_MODELS, Task, available_models
from airflow_trainpipe.config.kubernetes import KubernetesSection
from airflow_trainpipe.config.speed import SpeedSection
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.config.types import PoolName, PretrainedUri, Quantity, StorageUri

_MODEL_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

# training.pool's defaults: a host's cores and a cluster's GPUs are different things to share out.
DEFAULT_POOLS = {"local": "trainpipe_training", "kubernetes": "trainpipe_kubernetes"}

Scalar = str | int | float | bool


class Hyperparameters(Section):
    """Optimisation settings, plus `model_args` passed to the model's builder."""

    epochs: PositiveInt = 10
    """Passes over the training rows."""

    max_steps: PositiveInt | None = None
    """Stop after this many optimizer steps, even mid-epoch."""

    batch_size: PositiveInt = 256
    """Micro-batch per process (DeepSpeed `train_micro_batch_size_per_gpu`)."""

    gradient_accumulation_steps: PositiveInt = 1
    """Micro-batches accumulated into one optimizer step."""

    learning_rate: PositiveFloat = 1e-3
    """AdamW learning rate."""

    weight_decay: NonNegativeFloat = 0.0
    """AdamW weight decay."""

    warmup_steps: NonNegativeInt = 0
    """Linear learning-rate warm-up steps (from 0 to `learning_rate`)."""

    warmup_ratio: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Warm-up as a share of the run's optimizer steps (the HF Trainer's `warmup_ratio`); the
    larger of the two warm-ups applies. 0.06-0.1 suits fine-tuning a pretrained encoder."""

    lr_schedule: Literal["auto", "constant", "linear", "cosine"] = "auto"
    """After warm-up: `linear` decays to `min_lr_ratio` x `learning_rate` at the last step (the
    HF Trainer's default), `cosine` follows half a cosine down to it, `constant` keeps it. `auto`:
    `linear` when fine-tuning (`training.pretrained`), `constant` from scratch, where a decay over
    a short run slows what little training it gets and the best epoch is registered anyway."""

    min_lr_ratio: float = Field(default=0.0, ge=0.0, le=1.0)
    """The floor the decay ends at, as a share of `learning_rate`."""

    seed: int = Field(default=42, ge=0)
    """Seed of weights, shuffling and dropout; same seed and data give the same model."""

    early_stopping_patience: PositiveInt | None = None
    """Stop when the validation metric (the gate's metric, on `data.validation`) has not improved
    for this many epochs; with `training.restore_best` the best epoch is still what is registered."""

    model_args: dict[str, Scalar | list[Scalar]] = {}
    """Keyword arguments of the model builder, e.g. `{hidden_sizes: [64, 32], dropout: 0.1}`."""

    def schedule(self, fine_tuning: bool) -> str:
        """The schedule `lr_schedule` means for a run that fine-tunes (or not)."""
        if self.lr_schedule != "auto":
            return self.lr_schedule
        return "linear" if fine_tuning else "constant"

    def with_overrides(self, overrides: dict[str, Any], max_steps: int | None = None) -> Hyperparameters:
        """One run's effective hyperparameters: these with `overrides` applied and the smaller of
        the two step limits, validated exactly as the YAML is (JSON mode: a form's `1` is a
        valid float). Raises pydantic's ValidationError naming the field."""
        merged = {**self.model_dump(mode="json"), **overrides}
        if max_steps is not None:
            merged["max_steps"] = min(max_steps, merged["max_steps"] or max_steps)
        return type(self).model_validate_json(json.dumps(merged))


# DeepSpeed keys that the typed fields own; an override would make two places disagree.
_OWNED_DEEPSPEED_KEYS = {
    "zero_optimization.stage": "training.deepspeed.zero_stage",
    "zero_optimization.offload_optimizer": "training.deepspeed.offload_optimizer",
    "zero_optimization.offload_param": "training.deepspeed.offload_params",
    "bf16": "training.deepspeed.precision",
    "fp16": "training.deepspeed.precision",
    "train_micro_batch_size_per_gpu": "training.hyperparameters.batch_size",
    "train_batch_size": "training.hyperparameters.batch_size",
    "gradient_accumulation_steps": "training.hyperparameters.gradient_accumulation_steps",
    "gradient_clipping": "training.deepspeed.gradient_clipping",
}


def _dotted_keys(mapping: dict[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for key, value in mapping.items():
        keys.append(prefix + key)
        if isinstance(value, dict):
            keys.extend(_dotted_keys(value, prefix + key + "."))
    return keys


class DeepSpeedSection(Section):
    """The DeepSpeed engine: ZeRO stage, precision, offload; `overrides` merges raw config last."""

    zero_stage: int = Field(default=1, ge=0, le=3)
    """ZeRO stage 0-3: 1 shards optimizer state, 2 also gradients, 3 also parameters."""

    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    """`auto` is bf16 on GPUs that support it, else fp16 on GPU, fp32 on CPU. `bf16` also runs on
    CPU ranks (DeepSpeed's CPU accelerator; faster than fp32 where the cores have bf16 instructions,
    BENCHMARKS.md); fp16 needs GPUs."""

    offload_optimizer: Literal["none", "cpu", "nvme"] = "none"
    """Keep optimizer state in CPU memory or on NVMe (ZeRO stage >= 1)."""

    offload_params: Literal["none", "cpu", "nvme"] = "none"
    """Keep parameters in CPU memory or on NVMe (ZeRO stage 3 only)."""

    nvme_path: str | None = None
    """Local NVMe mount for `nvme` offload."""

    gradient_clipping: NonNegativeFloat = 1.0
    """Clip the global gradient norm (0 disables)."""

    overrides: dict[str, Any] = {}
    """Raw DeepSpeed config merged last, for settings not modelled here (e.g. `zero_optimization: {overlap_comm: true}`)."""

    @model_validator(mode="after")
    def _consistent(self) -> DeepSpeedSection:
        problems: FieldProblems = []
        if self.offload_params != "none" and self.zero_stage != 3:
            problems.append((("offload_params",), f"needs zero_stage 3, got zero_stage {self.zero_stage}"))
        if self.offload_optimizer != "none" and self.zero_stage == 0:
            problems.append((("offload_optimizer",), "needs zero_stage 1, 2 or 3, got zero_stage 0"))
        if "nvme" in (self.offload_optimizer, self.offload_params) and not self.nvme_path:
            problems.append((("nvme_path",), "nvme offload needs nvme_path, a local NVMe mount"))
        for key in _dotted_keys(self.overrides):
            if key in _OWNED_DEEPSPEED_KEYS:
                problems.append(
                    (
                        ("overrides", *key.split(".")),
                        f"is set through {_OWNED_DEEPSPEED_KEYS[key]}; set it there",
                    )
                )
        field_problems(problems)
        return self


class Resources(Section):
    """What one training job gets; `processes_per_node` is torchrun's --nproc-per-node."""

    nodes: PositiveInt = 1
    """Machines (pods) the job spans; more than 1 needs `launcher: kubernetes`."""

    gpus_per_node: NonNegativeInt = 0
    """GPUs per node; 0 trains on CPU with the gloo backend."""

    processes_per_node: PositiveInt | None = None
    """Training processes per node; defaults to `gpus_per_node`, or 1 on CPU."""

    cpu: Quantity = "2"
    """CPU request per node (Kubernetes quantity)."""

    memory: Quantity = "4Gi"
    """Memory request per node (Kubernetes quantity)."""

    @model_validator(mode="after")
    def _one_process_per_gpu(self) -> Resources:
        if self.gpus_per_node and self.processes_per_node and self.processes_per_node > self.gpus_per_node:
            field_problems(
                [
                    (
                        ("processes_per_node",),
                        f"{self.processes_per_node} exceeds gpus_per_node {self.gpus_per_node}; use one process per GPU",
                    )
                ]
            )
        return self

    @property
    def nproc_per_node(self) -> int:
        return self.processes_per_node or self.gpus_per_node or 1


class CheckpointSection(Section):
    """Checkpoints under `<uri>/<pipeline>/<run_id>/`; a retry resumes from the newest complete one."""

    uri: StorageUri = "checkpoints"
    """Checkpoint root: `s3://...`, `file:///...` or relative to TRAINPIPE_HOME."""

    every_steps: PositiveInt | None = 200
    """Save every N optimizer steps."""

    every_minutes: PositiveFloat | None = None
    """Save every T minutes of training, whichever of the two comes first."""

    keep_last: PositiveInt = 2
    """Complete checkpoints kept, newest first; older ones are deleted."""

    keep_best: bool = True
    """Also keep the checkpoint with the best validation metric, separately (`restore_best` needs it)."""

    async_upload: bool = Field(default=True, alias="async")
    """Upload in the background so the training loop does not stall."""

    preemption_grace: PositiveFloat = 30.0
    """Seconds a SIGTERM (spot notice, pod deletion, task kill) leaves the job: every rank finishes
    its step and a complete checkpoint is written, so the retry recomputes nothing. A save still
    running after this is abandoned and the previous checkpoint stays the one resumed from; pods'
    `terminationGracePeriodSeconds` and torchrun's shutdown timeout follow it."""

    compression: Literal["none", "zstd"] = "none"
    """`zstd` stores every checkpoint file zstd-compressed (lossless: a resume stays bit-exact) and
    unpacks it on resume. fp32 weights and Adam moments barely compress: 0.9 of the bytes for a
    100M-parameter model, for a slower save and load (BENCHMARKS.md)."""

    @property
    def shutdown_timeout_s(self) -> int:
        """torchrun's wait between forwarding SIGTERM to the ranks and SIGKILLing them: the grace
        plus the ranks' exit. Whoever SIGTERMs torchrun (the operator, Kubernetes) waits longer."""
        return math.ceil(self.preemption_grace) + 5

    @property
    def termination_grace_s(self) -> int:
        """What the operator's on_kill and a pod's terminationGracePeriodSeconds wait for torchrun."""
        return self.shutdown_timeout_s + 5

    @model_validator(mode="after")
    def _has_interval(self) -> CheckpointSection:
        if self.every_steps is None and self.every_minutes is None:
            field_problems(
                [
                    (
                        ("every_steps",),
                        "set every_steps, every_minutes or both; without one nothing could be resumed",
                    )
                ]
            )
        return self


class TrainingSection(Section):
    """How the candidate model is trained."""

    model: str
    """Model name from the registry: built-in `tabular_mlp`, or one an installed package registers."""

    task: Task
    """`binary_classification`, `multiclass_classification`, `regression` or `ranking`; decides the
    model's outputs, the loss and the metrics."""

    ranking_loss: Literal["listwise", "pairwise"] = "listwise"
    """`ranking` only: `listwise` (softmax cross-entropy over each group's rows, ListNet) or
    `pairwise` (logistic loss on every pair of one group with different relevance, RankNet)."""

    hyperparameters: Hyperparameters = Hyperparameters()
    """Optimisation settings."""

    activation_checkpointing: bool = False
    """Recompute each encoder layer's activations in the backward pass instead of keeping them
    (`text_encoder`, or a model whose builder takes `activation_checkpointing`): less memory per
    rank for about one more forward of the encoder per step."""

    pretrained: PretrainedUri | None = None
    """A Hugging Face format directory the model starts from (config.json, model.safetensors,
    the tokenizer's tokenizer.json): `s3://...`, `file:///...`, a path relative to TRAINPIPE_HOME,
    or a registered version, `models:/NAME/VERSION` or `models:/NAME@ALIAS` (fine-tune from
    yesterday's champion: its encoder, tokenizer and head). Read offline and as safetensors
    only; its tokenizer replaces a fitted one; its sha256 is recorded on the run and the version.
    `text_encoder` with one text input (docs/pretrained.md)."""

    deepspeed: DeepSpeedSection = DeepSpeedSection()
    """DeepSpeed engine settings."""

    speed: SpeedSection = SpeedSection()
    """The training step's levers: optimizer kernels, attention, compilation, where the rows are."""

    resources: Resources = Resources()
    """Nodes, GPUs, processes, CPU and memory."""

    launcher: Literal["local", "kubernetes"] = "local"
    """`local` runs torchrun beside the Airflow worker; `kubernetes` runs it in pods."""

    image: str | None = None
    """Trainer container image (required with `launcher: kubernetes`)."""

    kubernetes: KubernetesSection = KubernetesSection()
    """Pods, scheduling and Secrets of `launcher: kubernetes`."""

    checkpoint: CheckpointSection = CheckpointSection()
    """Checkpointing and resume."""

    pool: PoolName | None = None
    """The Airflow pool whose slots the train task takes while its job runs: one slot per rank
    (`launcher: local`) or per GPU (`kubernetes`; 1 for a CPU-only job). null: `trainpipe_training`
    for local jobs, sized to the ranks a worker host may run at once, and `trainpipe_kubernetes`
    for pods. `trainpipe pools --apply` creates or grows them (`make up` does). A pool that does
    not exist keeps the task `scheduled` for ever; the scheduler logs why."""

    priority_weight: PositiveInt = 1
    """The train task's place in the queue for pool slots, as is (Airflow's `absolute` weight
    rule): e.g. 10 for a nightly production retrain, 1 for an exploratory study."""

    restore_best: bool = True
    """Register the best epoch's weights, by the gate's metric on the validation split, not the
    last epoch's (the HF Trainer's `load_best_model_at_end`). Its checkpoint is kept for it
    (`checkpoint.keep_best`), so a retry after the best epoch still registers the best."""

    @property
    def pool_name(self) -> str:
        return self.pool or DEFAULT_POOLS[self.launcher]

    @property
    def pool_slots(self) -> int:
        """The slots one job takes of `pool`: its ranks when they run beside the worker, its GPUs
        when they run in pods (the cluster's quota is Kueue's, `kubernetes.queue`)."""
        return self.slots_for(self.resources.nproc_per_node)

    def slots_for(self, nproc_per_node: int) -> int:
        """The slots of a job of this section's launcher with `nproc_per_node` ranks per node (a trial)."""
        if self.launcher == "local":
            return nproc_per_node
        return max(1, self.resources.nodes * self.resources.gpus_per_node)

    @field_validator("model")
    @classmethod
    def _registered_model(cls, value: str) -> str:
        if ":" in value or "." in value or "/" in value:
            raise ValueError(
                f"{value!r} looks like an import path; configs name registered models only. "
                "Register yours under the 'airflow_trainpipe.models' entry point and use its name"
            )
        if not _MODEL_NAME.match(value):
            raise ValueError(f"a model name is lower_snake_case, got {value!r}")
        if value in BUILTIN_MODELS:
            return value  # no entry-point scan (~30 ms of a DAG-processor parse) for the built-ins
        models = available_models()
        if value not in models:
            raise ValueError(
                f"unknown model {value!r}{did_you_mean(value, models)}; available: {', '.join(sorted(models))}"
            )
        return value

    @field_validator("image")
    @classmethod
    def _valid_image(cls, value: str | None) -> str | None:
        if value is not None and (not value or any(c.isspace() for c in value)):
            raise ValueError(
                f"expected a container image reference such as registry/trainer:1.0, got {value!r}"
            )
        return value

    @model_validator(mode="after")
    def _launcher_fits(self) -> TrainingSection:
        problems: FieldProblems = []
        if self.launcher == "kubernetes" and not self.image:
            problems.append((("image",), "launcher kubernetes needs `image`, the trainer container image"))
        if self.launcher == "kubernetes":
            problems.extend(pod_storage_problems(self.checkpoint.uri, self.kubernetes, ("checkpoint", "uri")))
            if self.pretrained and not self.pretrained.startswith("models:"):
                problems.extend(pod_storage_problems(self.pretrained, self.kubernetes, ("pretrained",)))
        min_nodes = self.kubernetes.min_nodes
        if min_nodes is not None and min_nodes > self.resources.nodes:
            problems.append(
                (("kubernetes", "min_nodes"), f"{min_nodes} exceeds resources.nodes {self.resources.nodes}")
            )
        if self.launcher == "local" and self.resources.nodes > 1:
            problems.append(
                (
                    ("resources", "nodes"),
                    f"launcher local runs on one node, got {self.resources.nodes}; "
                    "use launcher kubernetes for several nodes",
                )
            )
        if self.restore_best and not self.checkpoint.keep_best:
            problems.append(
                (
                    ("restore_best",),
                    "needs checkpoint.keep_best: true (the best epoch's checkpoint must outlive "
                    "pruning); or set restore_best: false to register the last epoch",
                )
            )
        problems.extend(self._speed_problems())
        if self.resources.gpus_per_node == 0 and self.deepspeed.precision == "fp16":
            problems.append(
                (
                    ("deepspeed", "precision"),
                    "fp16 needs GPUs (resources.gpus_per_node > 0); use fp32, bf16 or auto on CPU",
                )
            )
        field_problems(problems)
        return self

    def _speed_problems(self) -> FieldProblems:
        """`speed` against the rest of the section: the task, the precision, the ZeRO stage."""
        problems: FieldProblems = [
            (("speed", *loc), message)
            for loc, message in self.speed.problems(
                self.resources.gpus_per_node > 0, self.hyperparameters.gradient_accumulation_steps
            )
        ]
        if self.speed.group_by_length and self.task == "ranking":
            problems.append(
                (
                    ("speed", "group_by_length"),
                    "would split a ranking group's rows between micro-batches, where its loss "
                    "compares them; ranking keeps each group in one micro-batch",
                )
            )
        if self.speed.immediate_grad_update and self.deepspeed.precision in ("fp32", "fp16"):
            problems.append(
                (
                    ("speed", "immediate_grad_update"),
                    f"is bf16's (DeepSpeed's bf16 optimizer); precision is {self.deepspeed.precision}",
                )
            )
        if self.speed.fused_qkv and self.deepspeed.zero_stage == 3:
            problems.append(
                (
                    ("speed", "fused_qkv"),
                    "needs deepspeed.zero_stage 0, 1 or 2: ZeRO-3 partitions each projection as "
                    "it is built, before the three could be joined",
                )
            )
        if self.speed.immediate_grad_update and self.deepspeed.zero_stage != 1:
            problems.append(
                (
                    ("speed", "immediate_grad_update"),
                    f"needs deepspeed.zero_stage 1 (DeepSpeed's bf16 optimizer is ZeRO-1's), got {self.deepspeed.zero_stage}",
                )
            )
        return problems


def pod_storage_problems(uri: str, kubernetes: KubernetesSection, loc: tuple[str, ...]) -> FieldProblems:
    """Pods do not share the worker's TRAINPIPE_HOME: their storage is s3:// or a mounted volume."""
    if uri.startswith("s3://"):
        return []
    if not uri.startswith("file://"):
        return [
            (
                loc,
                f"{uri!r} is relative to the Airflow worker's TRAINPIPE_HOME, which pods do not see; "
                "use s3://... or file:// on a volume in training.kubernetes.volumes",
            )
        ]
    # Normalised first: file:///data/../etc names /etc, whatever its prefix says.
    path = posixpath.normpath(unquote(uri.removeprefix("file://")))
    if not any(
        path == v.mount_path.rstrip("/") or path.startswith(v.mount_path.rstrip("/") + "/")
        for v in kubernetes.volumes
    ):
        mounts = ", ".join(v.mount_path for v in kubernetes.volumes) or "none"
        return [(loc, f"{uri} is not on a volume the pods mount (training.kubernetes.volumes: {mounts})")]
    return []
