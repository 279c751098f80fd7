"""The training step alone: the job's step over its row stream vs a bare DeepSpeed step, on one engine.

Whole-job runs of a ~10 ms step swing by tens of percent from one run to the next on a shared
2-core VM (the training section's range column), so this measures the part of the job that
runs every step inside one pair of processes, where both sides see the same machine:

- ours: `StepRunner.run` (the job's step) taking its rows from `BlockStream` as the job builds it
  (chunk loads with their all-gather, background prefetch, `data.encoded_cache_mib`) at the
  `ResumableSampler`'s positions;
- bare: the hand-written loop of benchmarks/deepspeed_baseline.py, rows fancy-indexed from the
  encoded training set held in memory.

Both drive the same DeepSpeed engine (the job's config), 2 gloo ranks, global batch 512, in
alternating blocks of 100 steps; a block of ours also waits for the prefetch it started, so all
of the stream's reading is charged to ours. Per-step time = median over the blocks. Not
included: checkpoints, the periodic collective, MLflow and events (the training section's
checkpoint overhead column and the whole-job ratios cover them).

`python benchmarks/step_bench.py` prints the table; `make bench` writes it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

from train_bench import ROWS, _spec  # benchmarks/ is on sys.path when run as a script

NPROC, BLOCK_STEPS, BLOCKS = 2, 100, 20
# The small model, whose ~10 ms step is where per-step overhead shows (the wide model's whole-job
# ratio is already measured in the training section).
CASES = [("[64, 32]", 1), ("[64, 32]", 0)]


def _worker(spec_file: str) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    from baseline_loop import InMemory

    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.runtime.accounting import Timing
    from airflow_trainpipe.runtime.data.blocks import BlockReader
    from airflow_trainpipe.runtime.data.reader import data_columns
    from airflow_trainpipe.runtime.data.sampler import ResumableSampler
    from airflow_trainpipe.runtime.data.stream import BlockStream
    from airflow_trainpipe.runtime.engine import build_engine, deepspeed_config, lr_factor
    from airflow_trainpipe.runtime.models import build_model
    from airflow_trainpipe.runtime.steps import StepRunner

    spec = TrainSpec.from_json(Path(spec_file).read_text())
    hp, data = spec.hyperparameters, spec.config.data
    deepspeed.init_distributed(dist_backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(hp.seed)
    memory = InMemory(spec)  # also the fit: the same transform for both sides
    prepared_blocks = memory.prepared
    model = build_model(
        spec.config.training.model,
        num_numeric=memory.transform.num_dense,
        cardinalities=memory.transform.cardinalities,
        task="binary_classification",
        **hp.model_args,
    )
    global_batch = hp.batch_size * world
    # The job's schedule over every step this engine takes (the example's: a constant rate).
    schedule = lr_factor(hp, (BLOCKS * 2 + 2) * BLOCK_STEPS)
    engine = build_engine(
        model, spec, deepspeed_config(spec, global_batch, world, universal=False, on_gpu=False), schedule
    )
    reader = BlockReader(spec.data_files, prepared_blocks.identities, data, data_columns(data))
    stream = BlockStream(
        prepared_blocks, reader, hp.seed, data.shuffle_buffer_rows, rank, world,
        epochs=1 << 30, cache_bytes=data.encoded_cache_mib << 20,
    )  # fmt: skip
    sampler = ResumableSampler(prepared_blocks.train_rows, global_batch, 1, world, rank, hp.seed)
    ours = StepRunner(engine, stream, "binary_classification", torch.device("cpu"), torch.float32)
    timing = Timing(first_step=0, earlier_compute_s=0.0, world_size=world, earlier_device_s=0.0)
    x, y = torch.from_numpy(memory.train_x), torch.from_numpy(memory.train_y)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(hp.seed))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    bare_step = 0

    def run_ours() -> None:
        for _ in range(BLOCK_STEPS):
            ours.run(sampler, 0, timing)
            if sampler.epoch_done():
                sampler.next_epoch()
        if stream._prefetched is not None:  # its reading is ours: finish it inside our block
            stream._prefetched[1].result()

    def run_bare() -> None:
        nonlocal bare_step
        for _ in range(BLOCK_STEPS):
            start = (bare_step * global_batch) % (len(y) - global_batch) + rank * hp.batch_size
            index = order[start : start + hp.batch_size]
            engine.backward(loss_fn(engine(x[index]).squeeze(1), y[index]))
            engine.step()
            bare_step += 1

    engine.train()
    run_ours()  # warm-up: first chunk, allocator, DeepSpeed's first steps
    run_bare()
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    for block in range(BLOCKS):
        name, body = ("ours", run_ours) if block % 2 == 0 else ("bare", run_bare)
        dist.barrier()
        started = time.perf_counter()
        body()
        dist.barrier()
        times[name].append((time.perf_counter() - started) / BLOCK_STEPS)
    if rank == 0:
        print("STEP " + json.dumps({k: statistics.median(v) for k, v in times.items()}), flush=True)
    stream.close()
    dist.destroy_process_group()


def _measure(tmp: Path, files: list[str], hidden: str, zero_stage: int) -> dict[str, float]:
    spec_file = tmp / "step_spec.json"
    spec_file.write_text(_spec(tmp, files, "step", hidden, zero_stage).to_json())
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC),
        str(Path(__file__).resolve()), "--worker", str(spec_file),
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.split("STEP ", 1)[1].splitlines()[0])


def bench_step() -> list[str]:
    from airflow_trainpipe.examples.synthetic import write_day

    lines = [
        "## Training step alone: ours vs a bare DeepSpeed step on one engine (issue 15)",
        "",
        f"{ROWS:,} synthetic transactions, {NPROC} CPU ranks (gloo), global batch {256 * NPROC}, fp32, the job's",
        f"DeepSpeed config; one engine, {BLOCKS} alternating blocks of {BLOCK_STEPS} steps (ours: the job's",
        "StepRunner over BlockStream, charged with all its reading; bare: the deepspeed_baseline loop over",
        "rows held in memory); median per-step time over the blocks. Checkpoints, tracking and the periodic",
        "collective are not in it (see the training section). Command: `make bench ONLY=step`.",
        "",
        "| model | ZeRO | ours ms/step | bare ms/step | ours / bare throughput |",
        "|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        files = write_day((tmp / "data").as_uri(), date(2026, 1, 1), ROWS, seed=11)
        for hidden, zero_stage in CASES:
            step = _measure(tmp, files, hidden, zero_stage)
            lines.append(
                f"| {hidden} | {zero_stage} | {1000 * step['ours']:.2f} | {1000 * step['bare']:.2f} "
                f"| **{step['bare'] / step['ours']:.3f}** |"
            )
    lines += ["", "Target (the whole job's, applied to its step): ours / bare >= 0.95.", ""]
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(sys.argv[2])
    else:
        print("\n".join(bench_step()))
