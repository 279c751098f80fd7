"""A minimal hand-written DeepSpeed loop: what the engine alone costs, with no pipeline around it.

Same data and encoding (runtime.data), same model (runtime.models), the job's DeepSpeed config
(runtime.engine.deepspeed_config: ZeRO stage, precision, clipping, batch sizes), same AdamW, same
global batch and steps, gloo on CPU; no checkpoints, tracking, evaluation, events or resumable
sampler. Beside ddp_baseline.py it splits our gap to plain DDP into DeepSpeed's share and the
pipeline's. Run as `torchrun --nproc-per-node N benchmarks/deepspeed_baseline.py --spec @spec.json --steps S`.
"""

from __future__ import annotations

import deepspeed
import torch
import torch.distributed as dist
from baseline_loop import arguments, data_and_model, timed_loop

from airflow_trainpipe.runtime.engine import deepspeed_config


def main() -> None:
    spec, steps = arguments()
    hp = spec.hyperparameters
    deepspeed.init_distributed(dist_backend="gloo")
    data, model = data_and_model(spec)
    world = dist.get_world_size()
    config = deepspeed_config(spec, hp.batch_size * world, world, universal=False, on_gpu=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        engine.backward(loss_fn(engine(x).squeeze(1), y))
        engine.step()

    timed_loop(spec, data, steps, train_step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
