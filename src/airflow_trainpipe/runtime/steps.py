"""One optimizer step, and the collective that follows every few of them.

`StepRunner` runs forward, backward and DeepSpeed's step over this rank's micro-batches, with the
levers of `training.speed` that act on the step itself: rows cut on the device, micro-batches
grouped by length, text widths counted on the host (so the host never waits for the device to
learn a shape), copies from pinned memory that do not block the host.
`PeriodicSync` gathers the losses of the steps since the last sync, every rank's checkpoint vote
and whether a rank got SIGTERM (runtime/resume/preemption.py) in one all-reduce: on a latency-bound job
a gloo round trip costs as much as a third of a step, so it runs every `SyncConfig.every` steps
(and on checkpoint steps, the last step and the end of an epoch). Long steps sync more often, so
that a SIGTERM is acted on within about `SyncConfig.latency_s`: after each sync the stride becomes
the largest divisor of `every` whose steps fit in it, from the mean step time all ranks measured.
Every rank reaches the same sync steps: all its conditions are deterministic or all-reduced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from airflow_trainpipe.config.speed import SpeedLevers
from airflow_trainpipe.contracts.events import emit
from airflow_trainpipe.core.exceptions import TrainpipeError
from airflow_trainpipe.runtime.accounting import Timing
from airflow_trainpipe.runtime.data.sampler import ResumableSampler
from airflow_trainpipe.runtime.data.stream import BlockStream, MicroBatch, to_device
from airflow_trainpipe.runtime.engine import input_dtype
from airflow_trainpipe.runtime.models.inputs import text_widths
from airflow_trainpipe.runtime.models.losses import loss_function
from airflow_trainpipe.runtime.models.packing import pack_text
from airflow_trainpipe.runtime.resume.checkpoint import CheckpointManager
from airflow_trainpipe.runtime.resume.faults import fault_point
from airflow_trainpipe.runtime.resume.preemption import PreemptionNotice
from airflow_trainpipe.runtime.tracking import Tracker


class StepRunner:
    """Forward, backward and optimizer step of one global batch, this rank's share of it."""

    def __init__(
        self,
        engine: Any,
        stream: BlockStream,
        task: str,
        device: torch.device,
        dtype: torch.dtype,
        ranking_loss: str = "listwise",
        levers: SpeedLevers | None = None,
    ):
        self.engine, self.stream, self.device = engine, stream, device
        self.dtype = input_dtype(engine, dtype)
        self.loss_fn = loss_function(task, ranking_loss)
        module = getattr(engine, "module", engine)
        # A mapping model with text inputs is told each batch's widths (runtime.models.inputs).
        self.passes_widths = bool(getattr(module, "keeps_float32_inputs", False) and stream.inputs.text)
        self.group_by_length = levers is not None and levers.group_by_length
        self.packing = bool(self.passes_widths and levers is not None and levers.packing)
        if self.packing and not getattr(module.model, "packs_text", False):
            raise TrainpipeError(
                "training.speed.packing: this model's text encoder cannot take packed rows (it needs "
                "attention sdpa or eager and an encoder whose masks transformers' masking_utils build, "
                "with position ids); set packing: false"
            )
        # A compiled model is compiled once per input shape: widths rounded up to 16 tokens
        # bound the shapes (96-token text: 6) for a little more padding.
        self.width_multiple = 16 if levers is not None and levers.compile_mode else 1

    def run(self, sampler: ResumableSampler, step: int, timing: Timing) -> torch.Tensor:
        """Optimizer step number `step`; returns this rank's mean micro-batch loss, a scalar on the
        device: read on the host only at the next sync, so that a GPU step is not waited for by the
        host before it queues the next one (an `.item()` per micro-batch did that)."""
        t0 = time.perf_counter()
        batches = self.stream.take_step(sampler.epoch, *sampler.step_positions())
        if self.group_by_length and len(batches) > 1:
            batches = by_length(batches, self.device)
        inputs = [
            (to_device(b.x, self.device, self.dtype), to_device(b.y, self.device), self._arguments(b))
            for b in batches
        ]
        timing.data_wait_s += time.perf_counter() - t0
        loss_sum = torch.zeros((), device=self.device)
        for k, (x, y, arguments) in enumerate(inputs):
            outputs = self.engine(x, **arguments)
            loss = self.loss_fn(outputs.float(), y)
            self.engine.backward(loss)
            if k == len(inputs) - 1:
                fault_point("mid_step", step)
            self.engine.step()
            loss_sum += loss.detach()
        return loss_sum / len(inputs)

    def _arguments(self, batch: MicroBatch) -> dict[str, Any]:
        """What the model is told besides the rows, all of it known on the host: the text widths,
        or the texts packed (runtime.models.packing)."""
        if not self.passes_widths:
            return {}
        widths = text_widths(batch.lengths, self.stream.inputs, self.width_multiple)
        if not self.packing:
            return {"widths": widths}
        packed = pack_text(batch.host_x, self.stream.inputs, batch.lengths)
        return {
            "widths": widths,
            "packed": {
                name: {key: to_device(array, self.device) for key, array in text.arrays().items()}
                for name, text in packed.items()
            },
        }


def by_length(batches: list[MicroBatch], device: torch.device) -> list[MicroBatch]:
    """A step's micro-batches with their rows sorted by text length, cut to the same sizes: the
    same rows, each micro-batch padded to a width near its own rows'."""
    lengths = np.concatenate([b.lengths for b in batches])
    order = np.argsort(lengths.sum(axis=1), kind="stable")
    x: Any
    y: Any
    host_x = np.concatenate([b.host_x for b in batches])[order]
    if isinstance(batches[0].x, torch.Tensor):
        on_device = to_device(order, device)
        x, y = torch.cat([b.x for b in batches])[on_device], torch.cat([b.y for b in batches])[on_device]
    else:  # cut on the host: the inputs are host_x
        x, y = host_x, np.concatenate([b.y for b in batches])[order]
    lengths = lengths[order]
    cut, at = [], 0
    for size in (len(b) for b in batches):
        cut.append(
            MicroBatch(x[at : at + size], y[at : at + size], lengths[at : at + size], host_x[at : at + size])
        )
        at += size
    return cut


@dataclass(frozen=True)
class SyncConfig:
    every: int = 10
    """Steps between collectives."""

    checkpoint_every: int | None = None
    """`training.checkpoint.every_steps`: those steps always sync (every rank saves together)."""

    latency_s: float = 1.0
    """Longest time between syncs that long steps may stretch the stride to (fast steps keep `every`)."""


@dataclass(frozen=True)
class SyncOutcome:
    train_loss: float
    """Mean loss over all ranks at the synced step."""

    complete_pending: bool
    """Every rank's part of the last checkpoint is written: its marker can be."""

    save: bool
    """A checkpoint is due (by steps, or by minutes on some rank's clock)."""

    preempted: bool = False
    """Some rank got SIGTERM: every rank stops after this step and checkpoints it."""


@dataclass
class PeriodicSync:
    cfg: SyncConfig
    checkpoints: CheckpointManager
    world_size: int
    tracker: Tracker | None  # rank 0 reports; the others pass None
    notice: PreemptionNotice | None = None
    group: Any = None
    """The host group (runtime/collectives.py): the stats are a host tensor, which nccl refuses."""
    learning_rate: Callable[[int], float] | None = None
    """The learning rate optimizer step k (1-based) used: logged beside its loss."""
    _losses: list[torch.Tensor] = field(default_factory=list)  # each step's, on the device
    _stride: int = 0  # 0: `every` until the first sync has measured a step
    _since: float = field(default_factory=time.perf_counter)

    def add(self, loss: torch.Tensor | float) -> None:
        self._losses.append(torch.as_tensor(loss))

    def after_step(
        self, step: int, total_steps: int, sampler: ResumableSampler, timing: Timing
    ) -> SyncOutcome | None:
        """Collective on the sync steps; None on the others."""
        every_steps = self.cfg.checkpoint_every
        by_steps = every_steps is not None and every_steps > 0 and step % every_steps == 0
        stride = self._stride or self.cfg.every
        if not (step % stride == 0 or by_steps or step == total_steps or sampler.epoch_done()):
            return None
        signalled = self.notice is not None and self.notice.signalled
        step_s = (time.perf_counter() - self._since) / len(self._losses)
        votes = [
            float(self.checkpoints.due(step)),
            float(self.checkpoints.pending_ready()),
            float(signalled),
            step_s,
        ]
        # The steps' losses come to the host here, in one copy: the only wait on the device.
        on_host = torch.stack([loss.to(torch.float64) for loss in self._losses]).cpu()
        stats = torch.cat([on_host, torch.tensor(votes, dtype=torch.float64)])
        dist.all_reduce(stats, group=self.group)
        first = step - len(self._losses) + 1
        losses = {first + i: v / self.world_size for i, v in enumerate(stats[:-4].tolist())}
        self._losses = []
        self._stride = self._stride_for(stats[-1].item() / self.world_size)
        self._since = time.perf_counter()
        if self.tracker is not None:
            self._report(losses, step, total_steps, sampler, timing)
        return SyncOutcome(
            train_loss=losses[step],
            complete_pending=stats[-3].item() == self.world_size,
            save=(by_steps or stats[-4].item() > 0) and not sampler.epoch_done(),
            preempted=stats[-2].item() > 0,
        )

    def _stride_for(self, step_s: float) -> int:
        """The largest divisor of `every` whose steps take at most `latency_s` (at least 1)."""
        fits = [
            d
            for d in range(1, self.cfg.every + 1)
            if self.cfg.every % d == 0 and d * step_s <= self.cfg.latency_s
        ]
        return max(fits, default=1)

    def _report(
        self, losses: dict[int, float], step: int, total_steps: int, sampler: ResumableSampler, timing: Timing
    ) -> None:
        assert self.tracker is not None
        rate = (step - timing.first_step) * sampler.global_batch / max(timing.elapsed(), 1e-9)
        for at, value in losses.items():
            lr = {"learning_rate": self.learning_rate(at)} if self.learning_rate is not None else {}
            self.tracker.log_metrics({"train_loss": value, **lr}, at)
            emit("step", step=at, loss=value)
        self.tracker.log_metrics({"samples_per_s": rate}, step)
        eta = (total_steps - step) * timing.elapsed() / max(step - timing.first_step, 1)
        emit(
            "progress",
            step=step,
            total_steps=total_steps,
            epoch=sampler.epoch,
            loss=losses[step],
            samples_per_s=round(rate, 1),
            eta_s=round(eta, 1),
        )
