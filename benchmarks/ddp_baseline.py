"""A plain, hand-written torchrun DDP loop: the baseline our DeepSpeed job is measured against.

Same data and encoding (runtime.data), same model (runtime.models), same global batch, same
AdamW, same gradient clipping, same number of steps, gloo on CPU; no checkpoints, no tracking,
no evaluation. Run as `torchrun --nproc-per-node N benchmarks/ddp_baseline.py --spec @spec.json --steps S`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from baseline_loop import arguments, data_and_model, timed_loop
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    spec, steps = arguments()
    hp = spec.hyperparameters
    dist.init_process_group("gloo")
    data, model = data_and_model(spec)
    model = DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=hp.learning_rate, weight_decay=hp.weight_decay)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    clipping = spec.config.training.deepspeed.gradient_clipping

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        loss = loss_fn(model(x).squeeze(1), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clipping)
        optimizer.step()

    timed_loop(spec, data, steps, train_step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
