"""A training job's setup: everything it does before its first step (the Trainer's builder).

`JobSetup(spec)` joins the job's process group (nccl for DeepSpeed on a GPU node, gloo for the
job's own collectives: runtime/collectives.py) and owns its checkpoints; `start()` pins the
pretrained directory, fits (or reuses) the transform, opens the data, builds the engine, resumes
from the newest complete checkpoint and starts the MLflow run, each phase lapped on the start-up
clock (runtime/startup.py), and returns where the loop starts. Collective throughout: every rank
gets rank 0's decisions (the fit, the checkpoint to resume from, the pin) or its error.

The Trainer (runtime/train.py) is a JobSetup with the loop and the end.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from airflow_trainpipe.config.catalog import METRICS
from airflow_trainpipe.config.speed import SpeedLevers, SpeedSection
from airflow_trainpipe.config.text import longest_input
from airflow_trainpipe.contracts.events import emit
from airflow_trainpipe.contracts.train_spec import PretrainedPin, TrainSpec
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.accounting import StepHighWater, Timing
from airflow_trainpipe.runtime.collectives import (
    host_group,
    quiet_deepspeed_gather_deprecation,
    quiet_unbound_barrier,
)
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import PreparedData, prepare
from airflow_trainpipe.runtime.data.reader import data_columns
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.tokens import BlockEncoder
from airflow_trainpipe.runtime.engine import (  # first: it selects DeepSpeed's accelerator
    build_engine,
    compute_dtype,
    deepspeed,
    deepspeed_config,
    lr_factor,
    model_construction,
    speed_in_force,
)
from airflow_trainpipe.runtime.evaluation.holdout import ShardedHoldout
from airflow_trainpipe.runtime.models import build_model
from airflow_trainpipe.runtime.models.inputs import ModelInputs
from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory
from airflow_trainpipe.runtime.pretrained.source import fetch, node_directory, pinned_directory
from airflow_trainpipe.runtime.resume.checkpoint import (
    CheckpointError,
    CheckpointManager,
    CompleteCheckpoint,
    data_identity,
    parameter_layout,
    refuse_other_data,
    refuse_other_layout,
)
from airflow_trainpipe.runtime.resume.preemption import PreemptionNotice
from airflow_trainpipe.runtime.resume.seeding import restore_rng_state, seed_everything
from airflow_trainpipe.runtime.rungs import TrialRungs
from airflow_trainpipe.runtime.startup import StartupClock
from airflow_trainpipe.runtime.tracking import Tracker, start_tracking

log = logging.getLogger("airflow_trainpipe.train")


@dataclass
class Start:
    """Where the loop starts: what `JobSetup.start` built or resumed."""

    sampler: ResumableSampler
    state: dict[str, Any]
    """The loop state: a fresh one, or the checkpoint's client state."""
    total_steps: int
    tracker: Tracker | None
    """Rank 0's MLflow run; None on the other ranks."""
    high_water: StepHighWater
    resumed_from: int
    recomputed: int
    """Steps earlier attempts ran past the checkpoint resumed from: they are trained again."""


class JobSetup:
    def __init__(
        self, spec: TrainSpec, notice: PreemptionNotice | None = None, clock: StartupClock | None = None
    ):
        self.spec = spec
        self.clock = clock  # None: a Trainer built by a test, whose process start is not the job's
        self.config = spec.config
        self.training = spec.config.training
        self.hp = spec.hyperparameters  # the effective, validated ones: never the config's
        self.on_gpu = torch.cuda.is_available() and self.training.resources.gpus_per_node > 0
        self.levers = speed_levers(self.training.speed, self.on_gpu)  # before any process group
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.device = torch.device("cuda", self.local_rank) if self.on_gpu else torch.device("cpu")
        if self.on_gpu:
            # Before the process group: its NCCL communicators, and a barrier on a group with no
            # device bound, use the current device, which must be this rank's from the start.
            torch.cuda.set_device(self.device)
        deepspeed.init_distributed(dist_backend="nccl" if self.on_gpu else "gloo")
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        quiet_unbound_barrier(self.on_gpu, self.world_size)
        quiet_deepspeed_gather_deprecation()
        # Every collective of ours moves host data: gloo, beside the training group when that is
        # nccl, which refuses host tensors (runtime/collectives.py).
        self.host_group = host_group(self.on_gpu)
        self._lap("rendezvous")
        self.notice = notice  # None: nobody listens for SIGTERM (a job built by a test)
        self.task = self.training.task
        self.gate_metric = self.config.gate.metric
        self.higher_is_better = METRICS[self.task][self.gate_metric] == "maximize"
        self.run_dir = spec.run_dir
        self.pinned: PretrainedPin | None = None  # the pretrained bytes, once pinned (_pretrained)
        self.timing: Timing | None = None  # the loop's clock, once it runs
        # Epoch ends score the validation split (a trial's is the pipeline's): the gate's holdout
        # is read once, at the end, to compare the chosen weights with the champion's.
        self.validation = (
            spec.trial.validation if spec.trial is not None else self.config.data.validation_split()
        )
        self.scored = "holdout" if self.validation is None else "validation"
        # A trial with rungs reports each to its study and stops when the pruner says so.
        self.rungs = (
            TrialRungs(spec.trial, self.config) if spec.trial is not None and spec.trial.rungs else None
        )
        self.checkpoints = CheckpointManager(
            self.training.checkpoint,
            self.run_dir,
            rank=self.rank,
            local_rank=self.local_rank,
            world_size=self.world_size,
            higher_is_better=self.higher_is_better,
            group=self.host_group,
        )

    def start(self) -> Start:
        """Collective: everything before the first step, each phase lapped on the start-up clock;
        where the loop starts (rank 0 has the MLflow run and has said `start`)."""
        seed_everything(self.hp.seed)
        self.pretrained = self._pretrained()
        self._lap("pretrained")
        prepared = self._prepare()
        self.prepared = prepared
        self._open_data(prepared)
        self._lap("prepare")
        resume = self._broadcast(self.checkpoints.latest_complete() if self.rank == 0 else None)
        self.data = data_identity(self.spec.data_files)  # in every marker
        if resume:
            refuse_other_data(resume, self.data, self.run_dir)
        global_batch = (
            int(resume.marker["global_batch"])
            if resume
            else self.hp.batch_size * self.hp.gradient_accumulation_steps * self.world_size
        )
        universal = (
            bool(resume) and resume.world_size != self.world_size and self.training.deepspeed.zero_stage > 0
        )
        self.ds_config = deepspeed_config(
            self.spec, global_batch, self.world_size, universal=universal, on_gpu=self.on_gpu
        )
        self.dtype = compute_dtype(self.ds_config)
        sampler = ResumableSampler(
            prepared.train_rows,
            global_batch,
            self.hp.gradient_accumulation_steps,
            self.world_size,
            self.rank,
            self.hp.seed,
        )
        total_steps = self._steps(self.hp.epochs, sampler.steps_per_epoch)
        # One multiplier per step for the job: the engine's scheduler follows it, the loop logs it.
        self.lr_factor = lr_factor(
            self.hp,
            self._schedule_steps(total_steps, sampler.steps_per_epoch),
            fine_tuning=self.training.pretrained is not None,
        )
        self.engine = self._build_engine(self.lr_factor)
        self.layout = parameter_layout(self.engine.module)  # in every checkpoint's marker
        self._lap("engine")
        high_water = StepHighWater(self.run_dir)
        state, resumed_from, recomputed = self._resume(resume, universal, sampler, high_water)
        self._lap("checkpoint_load")
        tracker = self._start_tracking(global_batch, resumed_from) if self.rank == 0 else None
        self._lap("tracking")
        if self.rank == 0:
            self._emit_start(total_steps, resumed_from, recomputed, global_batch, tracker)
        return Start(sampler, state, total_steps, tracker, high_water, resumed_from, recomputed)

    def _emit_start(
        self, total_steps: int, resumed_from: int, recomputed: int, global_batch: int, tracker: Tracker | None
    ) -> None:
        prepared = self.prepared
        emit(
            "start",
            total_steps=total_steps,
            resumed_from=resumed_from,
            steps_recomputed=recomputed,
            world_size=self.world_size,
            threads=torch.get_num_threads(),  # per rank: jobs side by side share the host's cores
            global_batch=global_batch,
            train_rows=prepared.train_rows,
            holdout_rows=prepared.holdout_rows,
            validation_rows=prepared.validation_rows,
            blocks=len(prepared.blocks),
            fit_s=round(prepared.fit_seconds, 3),
            mlflow_run_id=tracker.run_id if tracker else None,
            startup=self.clock.rounded() if self.clock else {},
            # What the engine runs, read off it rather than the config: a test (or a user) sees
            # that bf16 and activation checkpointing are really on, not only asked for.
            dtype=str(self.dtype).removeprefix("torch."),
            activation_checkpointing=any(
                getattr(m, "is_gradient_checkpointing", False) for m in self.engine.module.modules()
            ),
            speed={
                **speed_in_force(self.engine),
                "group_by_length": self.levers.group_by_length,
                "packing": self.levers.packing,
                "data_on_device": self.levers.data_on_device,
            },
        )

    def _schedule_steps(self, total_steps: int, steps_per_epoch: int) -> int:
        """The steps the learning-rate schedule spans: the run's, or a tuning trial's full budget
        (a rung's job trains part of it, and must follow the same curve as the whole)."""
        trial, tuning = self.spec.trial, self.config.tuning
        if trial is None or trial.budget is None or tuning is None:
            return total_steps
        if tuning.pruning.resource == "steps":
            return trial.budget
        return self._steps(trial.budget, steps_per_epoch)

    def _steps(self, epochs: int, steps_per_epoch: int) -> int:
        """Optimizer steps in `epochs`, `max_steps` at most."""
        return min(self.hp.max_steps or 1 << 62, epochs * steps_per_epoch)

    def _build_engine(self, schedule: Callable[[int], float]) -> Any:
        with model_construction(self.ds_config):  # ZeRO-3: partitioned as it is built
            model = self._build_model()
        if self.rank == 0:
            log.info("model built: %s", _held(model))
        return build_engine(model, self.spec, self.ds_config, schedule, self.levers)

    def _open_data(self, prepared: PreparedData) -> None:
        """The block reader, the encoder the stream and the holdout share, the holdout."""
        self.reader = BlockReader(
            self.spec.data_files, prepared.identities, self.config.data, data_columns(self.config.data),
            self.validation,
        )  # fmt: skip
        # Token ids are cached per snapshot and fit (runtime.data.tokens): the stream and the
        # holdout share one encoder, so each block is tokenized once on this node.
        self.encoder = BlockEncoder(self.reader, prepared.transform, self.spec.data_digest or prepared.key)
        self.holdout = ShardedHoldout(
            prepared, self.reader, self.task, self.rank, self.world_size, self.host_group,
            threshold=self.config.evaluation.threshold, validation=self.validation is not None,
            encoder=self.encoder,
        )  # fmt: skip

    def _resume(
        self,
        resume: CompleteCheckpoint | None,
        universal: bool,
        sampler: ResumableSampler,
        high_water: StepHighWater,
    ) -> tuple[dict[str, Any], int, int]:
        """Collective: the loop state of the newest complete checkpoint (or a fresh one), the step
        it resumes from and how many steps earlier attempts ran past it."""
        if not resume:
            return (
                {
                    "step": 0,
                    "history": [],
                    "compute_seconds": 0.0,
                    "device_seconds": 0.0,
                    "best": None,
                    "stale_epochs": 0,
                    "rungs": {},
                    "startup_device_seconds": 0.0,
                    "study_device_seconds": 0.0,
                },
                0,
                0,
            )
        refuse_other_layout(resume, self.layout)
        directory, tag = self.checkpoints.fetch(resume)
        if universal:
            tag = self.checkpoints.to_universal(resume)
        path, client = self.engine.load_checkpoint(directory, tag=tag)
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load checkpoint {resume.uri}")
        state = client["trainpipe"]
        sampler.load_state_dict(state["sampler"])
        if resume.world_size == self.world_size:
            restore_rng_state(state["rng"][self.rank])
        recomputed = max(
            0, self._broadcast(high_water.high_water() if self.rank == 0 else None) - state["step"]
        )
        if self.rank == 0:
            log.warning(
                "resumed from %s at step %d (world size %d -> %d)",
                resume.uri,
                state["step"],
                resume.world_size,
                self.world_size,
            )
        return state, state["step"], recomputed

    def _start_tracking(self, global_batch: int, resumed_from: int) -> Tracker:
        return start_tracking(
            self.spec,
            self.ds_config,
            world_size=self.world_size,
            global_batch=global_batch,
            resumed_from=resumed_from,
            transform_hash=self.prepared.transform.hash,
            pretrained=self.pinned,
        )

    def _pretrained(self) -> PretrainedDirectory | None:
        """Collective: the run's pretrained directory on this node, checked, or None. Rank 0 pins
        it (an earlier attempt's pin, or the spec's when reproducing) and checks it; every other
        node's first rank fetches the pinned bytes; an error stops every rank before any step."""
        uri = self.training.pretrained
        if uri is None:
            return None

        def pin_and_check() -> dict[str, Any]:
            path, pin = pinned_directory(uri, self.spec.pin_dir, self.spec.pretrained)
            longest = longest_input(self.config.data.features.text, self.config.features.text)
            PretrainedDirectory(path, pin.source, pin.sha256).check(longest)
            return pin.model_dump(mode="json")

        # Any error: an S3 or registry failure must stop the other ranks too, not leave them waiting.
        self.pinned = PretrainedPin.model_validate(self.from_rank0(pin_and_check, Exception))
        if self.local_rank == 0 and self.rank != 0:
            fetch(self.pinned)  # another node: its own copy, checked against the pin
        dist.barrier(group=self.host_group)  # every node's copy is in place
        return PretrainedDirectory(node_directory(self.pinned.source), self.pinned.source, self.pinned.sha256)

    def _prepare(self) -> PreparedData:
        """Collective: rank 0 fits once for the run (or reuses the fit of an earlier attempt), and
        every rank gets that very result, or the error that stopped it."""

        def fit() -> str:
            return prepare(
                self.spec.data_files,
                self.config.data,
                self.config.features,
                self.task,
                self.spec.manifest,
                self.run_dir,
                self.validation,
                self.pretrained,
            ).to_json()

        return PreparedData.from_json(self.from_rank0(fit, TrainpipeError))

    def from_rank0(self, compute: Callable[[], Any], errors: type[BaseException]) -> Any:
        """Collective: what `compute` returns on rank 0, on every rank; an error of type `errors`
        on rank 0 is raised on every rank."""
        box: list[Any] = [None]
        if self.rank == 0:
            try:
                box = [compute()]
            except errors as exc:
                box = [exc]
                dist.broadcast_object_list(box, src=0, group=self.host_group)
                raise
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]

    def _build_model(self) -> torch.nn.Module:
        transform = self.prepared.transform
        return build_model(
            self.training.model,
            inputs=ModelInputs.of(transform),
            task=self.task,
            num_outputs=transform.num_outputs,
            pretrained=str(self.pretrained.path) if self.pretrained is not None else None,
            activation_checkpointing=self.training.activation_checkpointing,
            attention=self.levers.attention,
            **self.hp.model_args,
        )

    def _lap(self, phase: str) -> None:
        if self.clock is not None:
            self.clock.lap(phase)

    def _broadcast(self, value: Any) -> Any:
        box = [value]
        dist.broadcast_object_list(box, src=0, group=self.host_group)
        return box[0]


def speed_levers(speed: SpeedSection, on_gpu: bool) -> SpeedLevers:
    """`training.speed` for this rank; what only a GPU runs stops a CPU rank before it starts (a
    config that asks for GPUs, run where there are none)."""
    try:
        return speed.for_rank(on_gpu)
    except ValueError as exc:
        raise TrainpipeError(str(exc)) from None


def _held(model: torch.nn.Module) -> str:
    """How much of the model this rank holds (ZeRO-3 builds it partitioned)."""
    parameters = list(model.parameters())
    total = sum(getattr(p, "ds_numel", p.numel()) for p in parameters)
    held = sum(p.ds_tensor.numel() if hasattr(p, "ds_tensor") else p.numel() for p in parameters)
    if held == total:
        return f"{total:,} parameters, whole on every rank"
    return f"{total:,} parameters, partitioned as built: this rank holds {held:,}"
