"""What the hand-written baselines share: the job's data and model, and a timed loop over
seeded per-epoch permutations in which each rank takes its slice of every global batch."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.runtime.data.blocks import BlockReader
from airflow_trainpipe.runtime.data.prepare import fit
from airflow_trainpipe.runtime.data.reader import data_columns
from airflow_trainpipe.runtime.models import build_model


def arguments() -> tuple[TrainSpec, int]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True, help="@path of a TrainSpec JSON file")
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    return TrainSpec.from_json(Path(args.spec[1:]).read_text()), args.steps


class InMemory:
    """The job's training rows, encoded by its transform and held whole, as a minimal script would."""

    def __init__(self, spec: TrainSpec):
        data = spec.config.data
        prepared = fit(spec.data_files, data, spec.config.features, spec.config.training.task)
        reader = BlockReader(spec.data_files, prepared.identities, data, data_columns(data))
        trains = [reader.parts(block)[0] for block in prepared.blocks]
        self.prepared, self.transform = prepared, prepared.transform
        self.train_x = np.concatenate([self.transform.features(t) for t in trains])
        self.train_y = np.concatenate([self.transform.labels(t) for t in trains])


def data_and_model(spec: TrainSpec) -> tuple[InMemory, torch.nn.Module]:
    """The job's encoded training set and a freshly seeded model (same seed as the job)."""
    hp = spec.hyperparameters
    torch.manual_seed(hp.seed)
    data = InMemory(spec)
    model = build_model(
        spec.config.training.model,
        num_numeric=data.transform.num_dense,
        cardinalities=data.transform.cardinalities,
        task=spec.config.training.task,
        **hp.model_args,
    )
    return data, model


def timed_loop(
    spec: TrainSpec, data: InMemory, steps: int, train_step: Callable[[torch.Tensor, torch.Tensor], None]
) -> None:
    """Run `steps` optimizer steps and print rank 0's `BASELINE {...}` line (loop time only)."""
    hp = spec.hyperparameters
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    global_batch = hp.batch_size * world
    steps_per_epoch = len(y) // global_batch
    dist.barrier()
    started = time.monotonic()
    step, epoch = 0, 0
    while step < steps:
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(hp.seed + epoch))
        for k in range(min(steps_per_epoch, steps - step)):
            start = k * global_batch + rank * hp.batch_size
            index = order[start : start + hp.batch_size]
            train_step(x[index], y[index])
            step += 1
        epoch += 1
    dist.barrier()
    elapsed = time.monotonic() - started
    if rank == 0:
        line = {"steps": step, "loop_s": elapsed, "samples_per_s": step * global_batch / elapsed}
        print("BASELINE " + json.dumps(line), flush=True)
