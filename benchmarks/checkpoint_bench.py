"""Checkpoint compression (issue 19): bytes on disk, save and load time, none vs zstd.

A ~100M-parameter `tabular_mlp` (built through the model registry, 7 hidden layers of 4096) under
the job's DeepSpeed engine (the example config's ZeRO stage 1, fp32 on CPU, one gloo rank), after
a few real AdamW steps on random rows so that the optimizer's moments are not zeros. The same
engine state is saved by CheckpointManager to local disk with `compression: none` and `zstd`,
alternately, ROUNDS times each:

- save: `CheckpointManager.save` of a local destination, which returns once the checkpoint is
  complete (DeepSpeed's write, sha256 or compression of every file, the marker, pruning);
- load: what a resume does: `latest_complete` (sha256 of every stored file), `fetch` (for zstd:
  decompress into the unpacking directory) and `engine.load_checkpoint`, after the weights were
  zeroed; the loaded weights' sha256 must equal the saved ones.

Then the files of the uncompressed checkpoint are compressed once per zstd level, and once with
a single worker thread (the choices in runtime/resume/compression.py). Times are medians over the rounds; the files are in the page cache
(just written), so disk reads are not what is measured.

`python benchmarks/checkpoint_bench.py` prints the section; `make bench` writes it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from airflow_trainpipe.runtime.resume.compression import LEVEL  # light: zstandard is imported where used

REPO = Path(__file__).resolve().parents[1]
NUM_NUMERIC, WIDTH, DEPTH = 32, 4096, 7
BATCH, STEPS, ROUNDS = 256, 4, 3
LEVELS = (1, 3, 9)


def _engine(tmp: Path):
    import torch

    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.runtime.engine import build_engine, deepspeed_config, lr_factor
    from airflow_trainpipe.runtime.models import build_model

    text = (REPO / "dags/configs/fraud_detector.yaml").read_text()
    spec = TrainSpec(config=parse_config(text), run_id="bench", data_files=[(tmp / "unused").as_uri()])
    torch.manual_seed(0)
    model = build_model(
        "tabular_mlp", num_numeric=NUM_NUMERIC, cardinalities=[], task="binary_classification",
        hidden_sizes=[WIDTH] * DEPTH, dropout=0.0,
    )  # fmt: skip
    ds_config = deepspeed_config(spec, BATCH, 1, universal=False, on_gpu=False)
    engine = build_engine(model, spec, ds_config, lr_factor(spec.hyperparameters, STEPS))
    loss_fn = torch.nn.BCEWithLogitsLoss()
    for _ in range(STEPS):
        x, y = torch.randn(BATCH, NUM_NUMERIC), torch.randint(0, 2, (BATCH,)).float()
        engine.backward(loss_fn(engine(x).squeeze(1), y))
        engine.step()
    return engine, ds_config["zero_optimization"]["stage"]


def _stored_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.name != "COMPLETE.json")


def _round(engine, zero_stage: int, manager, step: int, expected: str) -> dict:
    import torch

    from airflow_trainpipe.runtime.engine import full_state_dict, weights_sha256
    from airflow_trainpipe.runtime.resume.checkpoint import tag_for

    started = time.perf_counter()
    manager.save(engine, step, {"trainpipe": {"step": step}})
    saved = time.perf_counter()
    with torch.no_grad():
        for parameter in engine.module.parameters():
            parameter.zero_()
    loading = time.perf_counter()
    directory, tag = manager.fetch(manager.latest_complete())
    path, _ = engine.load_checkpoint(directory, tag=tag)
    loaded = time.perf_counter()
    assert path is not None
    return {
        "bytes": _stored_bytes(Path(manager.staging) / tag_for(step)),
        "save_s": saved - started,
        "load_s": loaded - loading,
        "identical": weights_sha256(full_state_dict(engine, zero_stage)) == expected,
    }


def _levels(directory: Path, scratch: Path) -> list[dict]:
    from airflow_trainpipe.runtime.resume import compression

    files = [p for p in directory.iterdir() if p.name != "COMPLETE.json"]
    original = sum(p.stat().st_size for p in files)
    rows = []
    for level, threads in [*((level, compression._threads()) for level in LEVELS), (LEVEL, 1)]:
        started, stored = time.perf_counter(), 0
        for path in files:
            stored += compression.compress_file(path, scratch / "level.zst", level, threads)[0]
        seconds = time.perf_counter() - started
        rows.append(
            {
                "level": level,
                "threads": threads,
                "ratio": stored / original,
                "seconds": seconds,
                "mib": original / 2**20,
            }
        )
    (scratch / "level.zst").unlink()
    return rows


def _worker(tmp: Path) -> None:
    import deepspeed

    from airflow_trainpipe.config.training import CheckpointSection
    from airflow_trainpipe.runtime.engine import full_state_dict, weights_sha256
    from airflow_trainpipe.runtime.extensions import clear_stale_build_locks
    from airflow_trainpipe.runtime.resume.checkpoint import CheckpointManager, tag_for

    clear_stale_build_locks()  # as the job does: a lock left by a killed build would hang init
    deepspeed.init_distributed(dist_backend="gloo")
    engine, zero_stage = _engine(tmp)
    parameters = sum(p.numel() for p in engine.module.parameters())
    expected = weights_sha256(full_state_dict(engine, zero_stage))
    managers = {
        kind: CheckpointManager(
            CheckpointSection(compression=kind, keep_last=1, keep_best=False),
            (tmp / kind).as_uri(),
            rank=0,
            local_rank=0,
            world_size=1,
            higher_is_better=True,
        )
        for kind in ("none", "zstd")
    }
    rounds: dict[str, list[dict]] = {kind: [] for kind in managers}
    for step in range(1, ROUNDS + 1):
        for kind, manager in managers.items():
            rounds[kind].append(_round(engine, zero_stage, manager, step, expected))
    levels = _levels(managers["none"].staging / tag_for(ROUNDS), tmp)
    print("CKPT " + json.dumps({"parameters": parameters, "zero_stage": zero_stage, "rounds": rounds,
                                "levels": levels}), flush=True)  # fmt: skip


def _measure() -> dict:
    with tempfile.TemporaryDirectory() as name:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
            str(Path(__file__).resolve()), "--worker", name,
        ]  # fmt: skip
        env = {**os.environ, "TRAINPIPE_HOME": name}
        done = subprocess.run(command, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"checkpoint bench failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return json.loads(done.stdout.split("CKPT ", 1)[1].splitlines()[0])


def bench_checkpoint() -> list[str]:
    load_before = os.getloadavg()[0]
    measured = _measure()
    load_after = os.getloadavg()[0]
    rounds = measured["rounds"]
    med = {kind: {key: statistics.median(r[key] for r in runs) for key in ("bytes", "save_s", "load_s")}
           for kind, runs in rounds.items()}  # fmt: skip
    lines = [
        "## Checkpoint compression: none vs zstd (issue 19)",
        "",
        f"`tabular_mlp` with {measured['parameters'] / 1e6:.1f}M parameters (7 hidden layers of {WIDTH}), the job's",
        f"DeepSpeed engine (ZeRO stage {measured['zero_stage']}, fp32, CPU, 1 gloo rank) after {STEPS} AdamW steps",
        "on random rows; the same state saved by CheckpointManager to local disk with each setting,",
        f"alternately, {ROUNDS} times (medians). Save: until the checkpoint is complete (DeepSpeed's write,",
        "sha256 or compression of each file, marker). Load: what a resume does (verify the stored files'",
        "sha256, unpack for zstd, `engine.load_checkpoint`). Files in the page cache, not read from disk.",
        "Command: `make bench ONLY=checkpoint`. The machine is shared: 1-minute load average",
        f"{load_before:.1f} before and {load_after:.1f} after the measurement, on {os.cpu_count()} cores.",
        "",
        "| compression | bytes on disk | stored / uncompressed | save (s) | load (s) | loaded weights bit-identical |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for kind in ("none", "zstd"):
        identical = all(r["identical"] for r in rounds[kind])
        lines.append(
            f"| {kind} | {med[kind]['bytes'] / 1e6:,.1f} MB | {med[kind]['bytes'] / med['none']['bytes']:.3f} "
            f"| {med[kind]['save_s']:.2f} | {med[kind]['load_s']:.2f} | {'yes' if identical else '**no**'} |"
        )
    lines += [
        "",
        f"zstd level and worker threads on the same uncompressed files, one pass each (the job uses level {LEVEL}):",
        "",
        "| level | threads | stored / uncompressed | compress (s) | MiB/s |",
        "|---:|---:|---:|---:|---:|",
        *(
            f"| {r['level']} | {r['threads']} | {r['ratio']:.3f} | {r['seconds']:.2f} | {r['mib'] / r['seconds']:.0f} |"
            for r in measured["levels"]
        ),
        "",
    ]
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(Path(sys.argv[2]))
    else:
        print("\n".join(bench_checkpoint()))
