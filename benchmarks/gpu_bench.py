"""The training step on a GPU: the support_tickets text pipeline with a ~100M-parameter encoder,
bf16, nccl, ours vs a bare DeepSpeed loop on the same engine, and the MFU of each.

It runs `text_bench`'s side-by-side worker (our StepRunner over BlockStream with the token cache
vs a hand-written DeepSpeed loop over the same rows held on the device, alternating blocks on one
engine) with a GPU spec, then counts forward+backward FLOPs per sample with torch's
FlopCounterMode on the bare side's batches (each padded to its longest row, as in training).
MFU = FLOPs per sample x samples/s / the device's dense bf16 peak.

On a GPU machine: `python benchmarks/gpu_bench.py --output gpu.md` prints the section and writes
it; BENCHMARKS.md keeps it (`make bench` on a CPU machine does not re-measure it).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
ROWS, BATCH, BLOCKS, BLOCK_STEPS = 60_000, 256, 12, 30
MODEL_ARGS = {
    "hidden_size": 768,
    "num_layers": 14,
    "num_heads": 12,
    "intermediate_size": 3072,
    "dropout": 0.1,
    "head_hidden_sizes": [256],
}
# Dense bf16 tensor-core peaks from the vendor's data sheets (without sparsity), by device name.
PEAK_BF16 = {"H100 80GB HBM3": 989e12, "H100 PCIe": 756e12, "H200": 989e12, "A100": 312e12}


def peak_flops(device: str) -> float:
    for name, peak in PEAK_BF16.items():
        if name in device:
            return peak
    if device == "cpu":  # --tiny, the script's own check on a machine without a GPU: no MFU to speak of
        return float("nan")
    raise SystemExit(f"no dense bf16 peak known for {device!r}: add it to PEAK_BF16")


def gpu_config(tmp: Path, zero_stage: int, batch: int) -> str:
    config = yaml.safe_load((REPO / "dags/configs/support_tickets.yaml").read_text())
    training = config["training"]
    training["checkpoint"].update(uri=(tmp / "ckpt").as_uri(), every_steps=10_000)
    training["hyperparameters"].update(batch_size=batch, learning_rate=1e-4, model_args=MODEL_ARGS)
    training["resources"] = {"gpus_per_node": 1, "processes_per_node": 1}
    training["deepspeed"] = {"zero_stage": zero_stage}  # precision auto: bf16 where the GPU has it
    return yaml.safe_dump(config, sort_keys=False)


def run(data: Path, tmp: Path, zero_stage: int, batch: int, shape: str | None, profile: bool) -> dict:
    import os

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec

    files = sorted(p.resolve().as_uri() for p in data.rglob("*.parquet"))
    name = f"z{zero_stage}_b{batch}"
    spec = TrainSpec(config=parse_config(gpu_config(tmp, zero_stage, batch)), run_id=name, data_files=files)
    spec_file = tmp / f"spec_{name}.json"
    spec_file.write_text(spec.to_json())
    # A larger batch gets fewer steps, so that every case takes about as long.
    blocks, steps = (
        (BLOCKS, BLOCK_STEPS) if batch <= BATCH else (BLOCKS * 2 // 3, max(5, BLOCK_STEPS * BATCH // batch))
    )
    if shape:
        blocks, steps = map(int, shape.split("x"))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        str(REPO / "benchmarks/text_bench.py"), "--worker", str(spec_file), str(blocks), str(steps),
    ]  # fmt: skip
    env = {**os.environ, **({"TRAINPIPE_BENCH_PROFILE": "1"} if profile else {})}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        print(f"{name} worker failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
        return {
            "failed": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else str(done.returncode)
        }
    out = done.stdout
    step = json.loads(out.split("STEP ", 1)[1].splitlines()[0])
    flops = json.loads(out.split("FLOPS ", 1)[1].splitlines()[0])
    found = {**step, **flops, "zero": zero_stage, "batch": batch, "blocks": blocks, "steps": steps}
    if "PROFILE " in out:
        found["profile"] = json.loads(out.split("PROFILE ", 1)[1].splitlines()[0])
    return found


def matmul_ceiling() -> float:
    """FLOP/s of an 8192^3 bf16 matrix product on this device (mean of 10 after 3 warm-ups): what
    the tensor cores give a single large GEMM here, beside the data-sheet peak."""
    import torch

    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (start.elapsed_time(end) / 1000)


def section(results: list[dict], ceiling: float | None = None) -> list[str]:
    any_result = next(r for r in results if "failed" not in r)
    device, peak = any_result["device"], peak_flops(any_result["device"])
    lines = [
        "## GPU: the text pipeline's training step, bf16 + nccl, ours vs bare DeepSpeed, MFU",
        "",
        f"One {device}, one rank (nccl), {any_result['dtype'].removeprefix('torch.')}, the support_tickets "
        f"text pipeline with a {any_result['parameters'] / 1e6:.1f}M-parameter encoder",
        f"({MODEL_ARGS['num_layers']} layers, hidden {MODEL_ARGS['hidden_size']}, {MODEL_ARGS['num_heads']} heads, "
        f"FFN {MODEL_ARGS['intermediate_size']}; WordPiece of 800, subject+body pairs of at most 96 tokens,",
        f"dynamic padding), {ROWS:,} tickets, alternating blocks of steps on one engine (count x steps below).",
        "Ours: StepRunner over BlockStream with the token cache (host rows copied to the device each step);",
        "bare: a hand-written DeepSpeed loop over the same rows already on the device. FLOPs per sample:",
        "forward+backward counted by torch's FlopCounterMode on the bare side's batches; MFU against the",
        f"dense bf16 peak of {peak / 1e12:.0f} TFLOP/s (data sheet)"
        + (
            f"; one 8192^3 bf16 matrix product measured {ceiling / 1e12:.0f} TFLOP/s here."
            if ceiling
            else "."
        ),
        "Command: `python benchmarks/gpu_bench.py` on the device machine.",
        "",
        "| ZeRO | batch | blocks x steps | ours ms/step | bare ms/step | ours / bare | data wait / our step "
        "| GFLOP/sample | MFU ours | MFU bare | peak GPU mem |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "failed" in r:
            lines.append(f"| {r['zero']} | {r['batch']} | failed: {r['failed']} | | | | | | | | |")
            continue
        mfu = {k: r["per_sample"] * r["batch"] / r[k] / peak for k in ("ours", "bare")}
        lines.append(
            f"| {r['zero']} | {r['batch']} | {r['blocks']} x {r['steps']} | {1000 * r['ours']:.1f} "
            f"| {1000 * r['bare']:.1f} | **{r['bare'] / r['ours']:.3f}** | {100 * r['wait_share']:.2f}% "
            f"| {r['per_sample'] / 1e9:.2f} | **{100 * mfu['ours']:.1f}%** | {100 * mfu['bare']:.1f}% "
            f"| {r['peak_gib']:.1f} GiB |"
        )
    lines.append("")
    lines.append(
        "Mean padded width of a batch's text (tokens), ours / bare: "
        + "; ".join(
            f"ZeRO-{r['zero']} batch {r['batch']} {r['width_ours']:.1f} / {r['width_bare']:.1f}"
            for r in results
            if "failed" not in r
        )
        + "."
    )
    for r in results:
        for side, found in r.get("profile", {}).items():
            busy = found["device_busy_ms_per_step"] / found["wall_ms_per_step"]
            top = ", ".join(f"{name} {ms} ms" for name, ms, _ in found["device_top"][:4])
            lines.append(
                f"\nProfile, ZeRO-{r['zero']} batch {r['batch']}, {side} (torch.profiler, 5 steps): "
                f"{found['wall_ms_per_step']:.1f} ms/step wall, device busy {100 * busy:.0f}% of it, "
                f"{found['kernels_per_step']:.0f} kernels and copies per step; "
                f"largest device consumers per step: {top}."
            )
    return [*lines, ""]


def main() -> None:
    global ROWS, BATCH, BLOCKS, BLOCK_STEPS
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", type=Path, help="ticket parquet files (default: written here)")
    parser.add_argument("--output", type=Path)
    parser.add_argument(
        "--case",
        action="append",
        help="ZERO:BATCH[:BLOCKSxSTEPS][:profile], repeatable (default: 1:256 and 3:256)",
    )
    parser.add_argument(
        "--tiny", action="store_true", help="a small model and a few steps: checks the script"
    )
    args = parser.parse_args()
    if args.tiny:
        ROWS, BATCH, BLOCKS, BLOCK_STEPS = 3_000, 32, 4, 3
        MODEL_ARGS.update(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    cases = [case.split(":") for case in args.case or [f"1:{BATCH}", f"3:{BATCH}"]]
    results = []
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        data = args.data
        if data is None:
            from datetime import date

            from airflow_trainpipe.examples.synthetic import write_day

            data = tmp / "data"
            write_day(data.as_uri(), date(2026, 1, 1), ROWS, seed=11, kind="support_tickets")
        for zero, batch, *rest in cases:
            shape = next((part for part in rest if "x" in part), None)
            results.append(run(data, tmp, int(zero), int(batch), shape, profile="profile" in rest))
            print(json.dumps(results[-1]), flush=True)
    import torch

    lines = section(results, matmul_ceiling() if torch.cuda.is_available() else None)
    print("\n".join(lines))
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
