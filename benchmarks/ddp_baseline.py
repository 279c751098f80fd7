"""A plain, hand-written torchrun DDP loop: the baseline our DeepSpeed job is measured against.

Same data and encoding (runtime.data), same model (runtime.models), same global batch, same
AdamW, same number of steps, gloo on CPU; no checkpoints, no tracking, no evaluation. Run as
`torchrun --nproc-per-node N benchmarks/ddp_baseline.py --spec @spec.json --steps S`.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from airflow_trainpipe.runtime.data import load_dataset
from airflow_trainpipe.runtime.models import build_model
from airflow_trainpipe.train_spec import TrainSpec


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--steps", type=int, required=True)
    args = parser.parse_args()
    spec = TrainSpec.from_json(Path(args.spec[1:]).read_text())
    hp = spec.config.training.hyperparameters
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(hp.seed)
    data = load_dataset(spec.data_files, spec.config.data, spec.config.features, spec.config.training.task)
    model = build_model(
        spec.config.training.model,
        num_numeric=data.transform.num_dense,
        cardinalities=data.transform.cardinalities,
        task=spec.config.training.task,
        **hp.model_args,
    )
    model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    x, y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    global_batch = hp.batch_size * world
    steps_per_epoch = len(y) // global_batch
    dist.barrier()
    started = time.monotonic()
    step, epoch = 0, 0
    while step < args.steps:
        order = torch.randperm(len(y), generator=torch.Generator().manual_seed(hp.seed + epoch))
        for k in range(min(steps_per_epoch, args.steps - step)):
            index = order[
                k * global_batch + rank * hp.batch_size : k * global_batch + (rank + 1) * hp.batch_size
            ]
            loss = loss_fn(model(x[index]).squeeze(1), y[index])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(
                model.parameters(), spec.config.training.deepspeed.gradient_clipping
            )
            optimizer.step()
            step += 1
        epoch += 1
    dist.barrier()
    elapsed = time.monotonic() - started
    if rank == 0:
        print(
            "BASELINE "
            + json.dumps({"steps": step, "loop_s": elapsed, "samples_per_s": step * global_batch / elapsed}),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
