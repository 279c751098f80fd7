"""Text models (issue 38), measured side by side in one run:

- step: the job's step (StepRunner over BlockStream, token ids from the per-node cache, the
  mapping model with dynamic padding) vs a bare DeepSpeed loop over the same rows encoded and held
  in memory, on one engine of the support_tickets text encoder; alternating blocks, median ms per
  step, and the share of our step time spent waiting for data;
- tokenization: the cache's fill (`TextEncoder.ids`: text out of Arrow, the batch encode, the id
  matrix) vs the `tokenizers` library's own `encode_batch_fast` of the same pairs (their strings
  out of Arrow, each row's ids read back: the least any use of it does), rows/s;
- memory: the whole job's largest per-rank peak RSS at 1M and 4M rows (a fixed number of steps);
- quality: macro-F1 on one holdout of the text model vs the same pipeline without its text.

`python benchmarks/text_bench.py` prints the tables; `make bench ONLY=text` writes them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import yaml
from train_bench import _ours  # benchmarks/ is on sys.path when run as a script; the same 2 ranks

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec

REPO = Path(__file__).resolve().parents[1]
NPROC, BLOCK_STEPS, BLOCKS = 2, 20, 10
STEP_ROWS, TOKEN_ROWS, QUALITY_ROWS = 40_000, 200_000, 20_000
# TRAINPIPE_TEXT_MEMORY_ROWS="250000,1000000" measures other sizes (the 4M job hit the collective
# timeout on 2 CPU ranks in the run of 2026-11-26; see BENCHMARKS.md).
MEMORY_ROWS = tuple(
    int(n) for n in os.environ.get("TRAINPIPE_TEXT_MEMORY_ROWS", "1000000,4000000").split(",")
)
MODEL_ARGS = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "dropout": 0.1, "head_hidden_sizes": [64]}


def _config(tmp: Path, text: bool = True, **hyperparameters: object) -> str:
    config = yaml.safe_load((REPO / "dags/configs/support_tickets.yaml").read_text())
    config["training"]["checkpoint"].update(uri=(tmp / "ckpt").as_uri(), every_steps=10_000)
    config["training"]["hyperparameters"].update(hyperparameters)
    if text:
        config["training"]["hyperparameters"]["model_args"] = MODEL_ARGS
    else:  # the same pipeline without its text: the columns alone
        del config["data"]["features"]["text"], config["features"]["text"]
        config["training"]["model"] = "tabular_mlp"
        config["training"]["hyperparameters"]["model_args"] = {"hidden_sizes": [64, 32]}
        config["evaluation"]["slices"] = [{"column": "customer_tier"}]
        config["validation"]["expectations"] = config["validation"]["expectations"][:2]
    return yaml.safe_dump(config, sort_keys=False)


def _spec(
    tmp: Path, files: list[str], run_id: str, text: bool = True, **hyperparameters: object
) -> TrainSpec:
    return TrainSpec(
        config=parse_config(_config(tmp, text, **hyperparameters)), run_id=run_id, data_files=files
    )


def _days(folder: Path, rows: int) -> list[str]:
    from airflow_trainpipe.examples.synthetic import write_day

    return write_day(folder.as_uri(), date(2026, 1, 1), rows, seed=11, kind="support_tickets")


# -- step -------------------------------------------------------------------------------------


def _worker(
    spec_file: str, blocks: int = BLOCKS, block_steps: int = BLOCK_STEPS, levers_on: bool = False
) -> None:
    """One side-by-side step run; on a GPU when the spec asks for one (nccl, the compute dtype the
    job would pick, the host collectives on gloo as in the Trainer), else on CPU ranks (gloo).

    `levers_on` (`--levers`): the engine both sides share is built with the spec's
    `training.speed` as the job builds it (AdamW's kernels, attention kernel, torch.compile;
    immediate_grad_update is in the DeepSpeed config either way), ours steps with those levers
    (rows cut on the device, text widths counted on the host), and the bare loop does what the
    job's step does at its best: widths counted on the host from the rows' token counts (rounded
    to 16 tokens when compiled, as the job rounds them) instead of read off the device, and the
    loss on float32 outputs. Off (the default): the engine, ours and the bare loop as before."""

    import deepspeed
    import numpy as np
    import torch
    import torch.distributed as dist

    from airflow_trainpipe.core.storage import local_path
    from airflow_trainpipe.runtime.accounting import Timing
    from airflow_trainpipe.runtime.data.blocks import BlockReader
    from airflow_trainpipe.runtime.data.prepare import fit
    from airflow_trainpipe.runtime.data.reader import data_columns
    from airflow_trainpipe.runtime.data.sampler import ResumableSampler
    from airflow_trainpipe.runtime.data.stream import BlockStream
    from airflow_trainpipe.runtime.data.tokens import BlockEncoder
    from airflow_trainpipe.runtime.engine import (
        build_engine,
        compute_dtype,
        deepspeed_config,
        input_dtype,
        lr_factor,
        model_construction,
    )
    from airflow_trainpipe.runtime.models import build_model
    from airflow_trainpipe.runtime.models.inputs import ModelInputs, text_lengths, text_widths
    from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory
    from airflow_trainpipe.runtime.steps import StepRunner

    spec = TrainSpec.from_json(Path(spec_file).read_text())
    hp, data = spec.hyperparameters, spec.config.data
    on_gpu = torch.cuda.is_available() and spec.config.training.resources.gpus_per_node > 0
    levers = spec.config.training.speed.for_rank(on_gpu) if levers_on else None
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    data_group = dist.new_group(backend="gloo") if on_gpu else None
    torch.manual_seed(hp.seed)
    # A fine-tune (pretrained_bench): the directory's tokenizer, its encoder built as the job
    # builds it (ZeRO-3: partitioned, loaded a layer at a time).
    pretrained = spec.config.training.pretrained
    directory = PretrainedDirectory(local_path(pretrained), pretrained) if pretrained else None
    prepared = fit(
        spec.data_files, data, spec.config.features, spec.config.training.task, pretrained=directory
    )
    transform = prepared.transform
    global_batch = hp.batch_size * world
    ds_config = deepspeed_config(spec, global_batch, world, universal=False, on_gpu=on_gpu)
    with model_construction(ds_config):
        model = build_model("text_encoder", inputs=ModelInputs.of(transform), task="multiclass_classification",
                            num_outputs=transform.num_outputs, pretrained=pretrained and str(directory.path),
                            attention=levers.attention if levers else None, **hp.model_args)  # fmt: skip
    # The job's learning-rate schedule over the steps this run takes (the rate does not change a step's work).
    steps_run = (2 + blocks) * block_steps
    schedule = lr_factor(hp, steps_run, fine_tuning=pretrained is not None)
    engine = build_engine(model, spec, ds_config, schedule, levers)
    dtype = compute_dtype(ds_config)
    reader = BlockReader(spec.data_files, prepared.identities, data, data_columns(data))
    encoder = BlockEncoder(reader, transform, prepared.key)
    # The bare side: every training row encoded (the cache filled on the way) and held in memory.
    trains = [encoder.side(block, "train") for block in prepared.blocks]
    host_x = np.concatenate([f for _, f in trains])
    x = torch.from_numpy(host_x).to(device, input_dtype(engine, dtype))
    y = torch.from_numpy(np.concatenate([transform.labels(t) for t, _ in trains])).long().to(device)
    stream = BlockStream(prepared, reader, hp.seed, data.shuffle_buffer_rows, rank, world, data_group,
                         epochs=1 << 30, cache_bytes=data.encoded_cache_mib << 20, encoder=encoder,
                         device=device if levers and levers.data_on_device else None)  # fmt: skip
    sampler = ResumableSampler(prepared.train_rows, global_batch, 1, world, rank, hp.seed)
    ours = StepRunner(engine, stream, "multiclass_classification", device, dtype, levers=levers)
    timing = Timing(first_step=0, earlier_compute_s=0.0, world_size=world, earlier_device_s=0.0)
    host_order = torch.randperm(len(y), generator=torch.Generator().manual_seed(hp.seed))
    order = host_order.to(device)
    loss_fn = torch.nn.CrossEntropyLoss()
    bare_step = 0
    # With levers: each row's token count per text input, on the host, for the bare side's widths.
    inputs = ModelInputs.of(transform)
    host_lengths = text_lengths(host_x, inputs) if levers_on else None
    multiple = 16 if levers is not None and levers.compile_mode else 1
    widths: dict[str, list[int]] = {"ours": [], "bare": []}

    def run_ours(steps: int = block_steps) -> None:
        for _ in range(steps):
            ours.run(sampler, 0, timing)
            if sampler.epoch_done():
                sampler.next_epoch()
        if stream._prefetched is not None:  # its reading is ours: finish it inside our block
            stream._prefetched[1].result()

    def run_bare(steps: int = block_steps) -> None:
        nonlocal bare_step
        for _ in range(steps):
            start = (bare_step * global_batch) % (len(y) - global_batch) + rank * hp.batch_size
            index = order[start : start + hp.batch_size]
            if host_lengths is None:
                engine.backward(loss_fn(engine(x[index]), y[index]))
            else:  # as the job's step: widths known on the host, the loss on float32 outputs
                shape = text_widths(
                    host_lengths[host_order[start : start + hp.batch_size].numpy()], inputs, multiple
                )
                widths["bare"] += list(shape)
                engine.backward(loss_fn(engine(x[index], widths=shape).float(), y[index]))
            engine.step()
            bare_step += 1

    # The padded width each side's batches got (dynamic padding: the batch's longest row), so
    # that both sides are seen to do the same work per sample.
    side = ["ours"]
    if levers_on:  # recorded on the host where each side counts them (a compiled module is not patched)
        counted = ours._arguments

        def counted_and_recorded(batch: Any) -> Any:
            found = counted(batch)
            widths["ours"] += list(found.get("widths") or ())
            return found

        ours._arguments = counted_and_recorded  # type: ignore[method-assign]
    else:
        mapping = engine.module.mapping

        def recorded(rows: Any, shape: Any = None) -> Any:
            batch = mapping(rows, shape)
            widths[side[0]] += [t["input_ids"].shape[1] for t in batch["text"].values()]
            return batch

        engine.module.mapping = recorded
    engine.train()
    run_ours()  # warm-up: first chunk, allocator, DeepSpeed's first steps
    run_bare()
    times: dict[str, list[float]] = {"ours": [], "bare": []}
    waited = timing.data_wait_s
    for block in range(blocks):
        name, body = ("ours", run_ours) if block % 2 == 0 else ("bare", run_bare)
        side[0] = name
        _synchronize(device)
        dist.barrier()
        started = time.perf_counter()
        body()
        _synchronize(device)  # a block ends when its kernels do, not when they are queued
        dist.barrier()
        times[name].append((time.perf_counter() - started) / block_steps)
    wait_share = (timing.data_wait_s - waited) / (sum(times["ours"]) * block_steps)
    if rank == 0:
        summary = {k: statistics.median(v) for k, v in times.items()}
        params = sum(getattr(p, "ds_numel", p.numel()) for p in engine.module.parameters())  # ZeRO-3: whole
        width = {f"width_{k}": statistics.mean(v) for k, v in widths.items()}
        print(
            "STEP " + json.dumps({**summary, **width, "wait_share": wait_share, "parameters": params}),
            flush=True,
        )
    if os.environ.get("TRAINPIPE_BENCH_PROFILE") and rank == 0:
        print("PROFILE " + json.dumps(_profile(device, {"ours": run_ours, "bare": run_bare})), flush=True)
    if block_steps != BLOCK_STEPS:  # asked for by gpu_bench, which reports MFU
        flops = _flops_per_sample(engine, loss_fn, x, y, order, hp.batch_size)
        name = torch.cuda.get_device_name(device) if on_gpu else "cpu"
        peak = torch.cuda.max_memory_allocated(device) / 2**30 if on_gpu else 0.0
        if rank == 0:
            print(
                "FLOPS "
                + json.dumps({"per_sample": flops, "device": name, "peak_gib": peak, "dtype": str(dtype)}),
                flush=True,
            )
    stream.close()
    dist.destroy_process_group()


def _synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profile(device: Any, sides: dict[str, Any], steps: int = 5) -> dict[str, Any]:
    """Where a step's time goes, per side: wall vs time the device was busy (kernels and copies),
    and the largest device and host consumers. Run after the timings (the profiler slows steps)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    found = {}
    for name, body in sides.items():
        _synchronize(device)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            started = time.perf_counter()
            body(steps)
            _synchronize(device)
            wall = time.perf_counter() - started
        events = prof.key_averages()
        # Busy time from the device's own events (kernels, copies) alone: an operator's device
        # time is its kernels' again, so summing every row would count it twice.
        kernels = [e for e in events if e.device_type == DeviceType.CUDA]
        by_device = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)
        by_host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
        found[name] = {
            "wall_ms_per_step": 1000 * wall / steps,
            "device_busy_ms_per_step": sum(e.self_device_time_total for e in kernels) / 1000 / steps,
            "kernels_per_step": sum(e.count for e in kernels) / steps,
            "device_top": [[e.key[:70], round(e.self_device_time_total / 1000 / steps, 2), e.count] for e in by_device[:15]],
            "host_top": [[e.key[:70], round(e.self_cpu_time_total / 1000 / steps, 2), e.count] for e in by_host[:15]],
        }  # fmt: skip
    return found


def _flops_per_sample(engine: Any, loss_fn: Any, x: Any, y: Any, order: Any, batch: int) -> float:
    """Forward and backward FLOPs per sample, counted by torch's FlopCounterMode over batches of
    the bare side's rows (each padded to its own longest row, as in training); no optimizer step,
    so it runs after the timings. The optimizer's elementwise work is not counted (as in MFU)."""
    from torch.utils.flop_counter import FlopCounterMode

    counted, samples = 0, 0
    for k in range(8):
        index = order[k * batch : (k + 1) * batch]
        with FlopCounterMode(display=False) as counter:
            engine.backward(loss_fn(engine(x[index]), y[index]))
        counted += counter.get_total_flops()
        samples += len(index)
    return counted / samples


def _step(tmp: Path) -> dict[str, float]:
    files = _days(tmp / "step_data", STEP_ROWS)
    spec_file = tmp / "step_spec.json"
    spec_file.write_text(_spec(tmp, files, "step", batch_size=64).to_json())
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(NPROC),
        str(Path(__file__).resolve()), "--worker", str(spec_file),
    ]  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.split("STEP ", 1)[1].splitlines()[0])


# -- tokenization -----------------------------------------------------------------------------


def _tokenization(tmp: Path) -> dict[str, float]:
    import pyarrow.parquet as pq

    from airflow_trainpipe.config.text import TextTransform
    from airflow_trainpipe.runtime.data.text import TextEncoder, TextFitter

    (file,) = _days(tmp / "token_data", TOKEN_ROWS)
    table = pq.read_table(file.removeprefix("file://"), columns=["subject", "body"])
    fitted = TextFitter("subject", ["subject", "body"], TextTransform(vocab_size=800, max_length=96)).fit(
        lambda: [table]
    )
    encoder = TextEncoder(fitted)
    timings: dict[str, list[float]] = {"ours": [], "library": []}
    for _ in range(3):
        started = time.perf_counter()
        encoder.ids(table)
        timings["ours"].append(time.perf_counter() - started)
        # The library alone, as any use of it needs: the column's strings in, each row's ids out.
        started = time.perf_counter()
        pairs = list(zip(table.column("subject").to_pylist(), table.column("body").to_pylist(), strict=True))
        [encoding.ids for encoding in encoder.tokenizer.encode_batch_fast(pairs)]
        timings["library"].append(time.perf_counter() - started)
    return {name: TOKEN_ROWS / statistics.median(values) for name, values in timings.items()}


# -- whole jobs -------------------------------------------------------------------------------


def _memory(tmp: Path) -> dict[int, dict]:
    found = {}
    for rows in MEMORY_ROWS:
        files = _days(tmp / f"memory_{rows}", rows)
        started = time.perf_counter()
        result = _ours(_spec(tmp, files, f"memory_{rows}", batch_size=64).limited_to(50))
        found[rows] = {"peak": max(result["peak_rss_mib"]), "seconds": time.perf_counter() - started}
    return found


def _quality(tmp: Path) -> dict[str, float]:
    files = _days(tmp / "quality_data", QUALITY_ROWS)
    scores = {}
    for name, text in (("text", True), ("tabular", False)):
        result = _ours(_spec(tmp, files, f"quality_{name}", text=text))
        scores[name] = result["evaluation"]["candidate"]["macro_f1"]
    return scores


def _shown(name: str, found: Any) -> Any:
    print(f"text bench, {name}: {json.dumps(found)}", file=sys.stderr, flush=True)
    return found


def bench_text() -> list[str]:
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        # Each part is printed as soon as it is measured: a later part that fails loses nothing.
        step = _shown("step", _step(tmp))
        tokens = _shown("tokenization", _tokenization(tmp))
        quality = _shown("quality", _quality(tmp))
        memory = _shown("memory", _memory(tmp))
    low, high = MEMORY_ROWS
    return [
        "## Text models: step, tokenization, memory, quality (issue 38)",
        "",
        f"The support_tickets example's text encoder ({MODEL_ARGS['num_layers']} layers, hidden {MODEL_ARGS['hidden_size']},",
        f"{MODEL_ARGS['num_heads']} heads, WordPiece of 800, subject+body as one pair of at most 96 tokens), {NPROC} CPU",
        "ranks (gloo), fp32, ZeRO-1. Command: `make bench ONLY=text`.",
        "",
        f"Step ({STEP_ROWS:,} tickets, global batch {64 * NPROC}, {BLOCKS} alternating blocks of {BLOCK_STEPS} steps on one",
        "engine; ours: StepRunner over BlockStream with the token cache, charged with all its reading; bare:",
        "the same rows encoded and held in memory, a hand-written DeepSpeed loop):",
        "",
        "| ours ms/step | bare ms/step | ours / bare throughput | data wait / our step time |",
        "|---|---|---|---|",
        f"| {1000 * step['ours']:.1f} | {1000 * step['bare']:.1f} | **{step['bare'] / step['ours']:.3f}** "
        f"| {100 * step['wait_share']:.2f}% |",
        "",
        f"Tokenization of {TOKEN_ROWS:,} subject+body pairs (median of 3): ours "
        f"{tokens['ours']:,.0f} rows/s, `encode_batch_fast` alone (strings in, ids out) {tokens['library']:,.0f} rows/s: "
        f"**{tokens['ours'] / tokens['library']:.3f}**.",
        "",
        f"Memory: the whole job's largest per-rank peak RSS, 50 steps: {low:,} rows {memory[low]['peak']:,.0f} MiB "
        f"({memory[low]['seconds']:.0f} s), {high:,} rows {memory[high]['peak']:,.0f} MiB "
        f"({memory[high]['seconds']:.0f} s): **{memory[high]['peak'] / memory[low]['peak']:.3f}**.",
        "",
        f"Quality on one holdout of {QUALITY_ROWS:,} tickets (4 epochs each): macro-F1 text model "
        f"**{quality['text']:.4f}**, the same pipeline without its text (tabular_mlp) {quality['tabular']:.4f}.",
        "",
        "Targets: ours / bare >= 0.95; tokenization >= 0.9x; data wait < 5%; RSS ratio <= 1.2; the text",
        "model clearly better. Not measured here: the whole job against a Hugging Face `Trainer` (it needs",
        "`accelerate`, which the project does not install; issue 39 measures it with the same DeepSpeed config).",
        "",
    ]


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--worker":
        # `--worker SPEC [BLOCKS [STEPS]] [--levers]`
        numbers = [int(a) for a in sys.argv[3:] if a != "--levers"]
        _worker(sys.argv[2], *numbers, levers_on="--levers" in sys.argv[3:])
    else:
        print("\n".join(bench_text()))
