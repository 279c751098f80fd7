r"""The training step's levers (`training.speed`, issue 55), each measured alone, on the product's own
job: `trainpipe train` once per row, never a bench worker alone.

In one run, on one machine:
1. a day of support tickets and a ~100M-parameter encoder directory (gpu_job's: `make-encoder`'s
   shape, 14 layers, hidden 768, FFN 3072), written once; the job's token cache filled once from
   them (every job of the run reads it) and the forward+backward FLOPs per sample counted once by
   FlopCounterMode on batches of the training rows at the baseline's padding (each micro-batch
   padded to its longest row), at both global batches;
2. `trainpipe train` of `dags/configs/support_tickets_finetune.yaml` reading its text alone (so that
   the HF Trainer and the bare loop train the very same model on the very same rows), ZeRO-1, bf16,
   one GPU, a new run id per row, `max_steps` short and no checkpoint inside the loop: a baseline
   (AdamW foreach, sdpa, no compile, no immediate_grad_update, no grouping, rows copied from the
   host, batch 256x1), then each lever alone over it, then "best" (every lever whose row gained
   at least 2% together) at batch 256 and at 1024, beside the baseline at 1024 and the micro-batch
   layout (1024x1 vs 256x4, and group_by_length over 256x4);
3. each job's steady ms/step from the `progress` events timestamped as they arrive (the job
   emits one at each of its syncs, after the steps' losses reached the host): from the first sync
   at or after the warm-up (compilation included) to the last, over the steps between; its
   start-up and end from result.json, what the start event says ran (`speed`, read off the
   engine), the holdout macro-F1 (a lever that breaks training shows there);
4. a plain `transformers.Trainer` on the same model, rows and batch (pretrained_bench's
   `_hf_worker`: its default optimizer, fused AdamW on a GPU) and the bare DeepSpeed loop on the
   best row's levers (text_bench's worker, `--levers`), and the aten ops (and GPU kernels) per
   optimizer step of the optimizer/ZeRO/immediate rows (torch.profiler over 3 steps of engines
   the runtime's own `build_engine` builds: the ~100M encoder on the GPU; in `--tiny` a narrow
   14-layer encoder on CPU, the 100M model's 233 parameter tensors).

Rows run in order of importance, each finding is logged as one `LEVERS <what> {json}` line as it
is found, and no row starts that would end past `--budget-s`: a run cut short still reports, and
the section names the rows it skipped. `--tiny` runs the same script on CPU with a small encoder
(GPU-only rows skipped with the reason the config loader gives) to check it before device time.

On the device machine (carry `.whl`: DeepSpeed, MLflow and their missing dependencies as wheels,
made here by `python scripts/device_wheels.py`;
the package is made importable from the working tree with its dist-info written by hand, since
the job's logged model names its own version), one call with timeout_s 600:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && v=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' src/airflow_trainpipe/__init__.py) && d=/tmp/site/airflow_trainpipe-$v.dist-info && mkdir -p $d && printf 'Metadata-Version: 2.1\nName: airflow-trainpipe\nVersion: %s\n' $v >$d/METADATA && export PYTHONPATH=/tmp/site:$PWD/src TORCH_EXTENSIONS_DIR=/tmp/torch_extensions && timeout 560 python3 benchmarks/gpu_levers.py --output $OUT/gpu_levers.md 2>&1 | tee $OUT/gpu_levers.log | grep -E '^(LEVERS|##|\||_)' ; ls $OUT

(`--budget-s 420` by default: ~8 minutes in all on an H100, the machine's start and the wheels
~2 minutes before it. At the priors' ~55 s a job row, a call gets through about 7 rows. For the
rows a call skipped, a second one: copy its `gpu_levers.log` here into benchmarks/var/ (ignored),
carry `benchmarks/var` too, and add `--earlier benchmarks/var/gpu_levers.log`: the rows measured
there are reused, so the second call runs only the others and its best, HF and bare rows take
every lever measured in either call. `--only NAME,...` runs the named rows alone, and measures
them again even when an earlier log has them.)
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import importlib.util
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_job import DAY, ENCODER_100M, ENCODER_TINY, peak_flops  # noqa: E402
from gpu_job import Job as _Job  # noqa: E402

# A 14-layer encoder as narrow as the tiny one: the ~100M encoder's parameter tensors (what the
# optimizer's per-tensor work scales with), for the op counts on CPU.
ENCODER_OPS_TINY = {**ENCODER_TINY, "layers": ENCODER_100M["layers"]}
SECTION = "## GPU: the training step's levers, one by one (issue 55)"
GAIN_THRESHOLD = 0.02  # a lever "helped" when its row's samples/s beat its reference's by this much
TARGETS = {"mfu_b": 0.35, "mfu_4b": 0.45, "vs_hf": 1.2, "vs_bare": 1.0}

# The baseline's settings: every lever off, as the issue's profile ran (foreach AdamW, sdpa,
# eager mode, ZeRO-1's optimizer, rows copied from the host each step).
BASELINE_SPEED = {
    "optimizer": "foreach",
    "attention": "sdpa",
    "compile": "none",
    "fused_qkv": False,
    "immediate_grad_update": False,
    "group_by_length": False,
    "packing": False,
    "data_on_device": False,
}
SPEED_KEYS = tuple(BASELINE_SPEED)
LAYOUT_KEYS = ("batch_size", "gradient_accumulation_steps")


def log(what: str, **found: Any) -> None:
    """One JSON line per finding, as it is found: a run cut short still shows what it measured."""
    print(f"LEVERS {what} " + json.dumps(found, default=str), flush=True)


# -- the rows -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One measurement: a job (`job`, or `best`, whose settings are chosen when it starts), the
    HF Trainer (`hf`), the bare DeepSpeed loop (`bare`) or the op counts (`ops`)."""

    name: str
    kind: str
    changed: str
    """What differs from `reference`, in words."""
    switch: dict[str, Any] = field(default_factory=dict)
    """Settings over the reference's (job rows): one lever, or the micro-batch layout."""
    reference: str | None = "baseline"
    scale: int = 1
    """Global batch = scale x the baseline's micro-batch."""


def baseline_settings(micro: int) -> dict[str, Any]:
    return {**BASELINE_SPEED, "zero_stage": 1, "batch_size": micro, "gradient_accumulation_steps": 1}


def plan(micro: int, tiny: bool) -> list[Row]:
    """Every row, in the order they run. On the device: the levers expected to matter most on a
    host-bound step first (immediate_grad_update halves the ops a step dispatches on CPU ranks,
    fused_qkv cuts them by a quarter, compiling fuses kernels, CUDA graphs replay them without
    launches), each before best so that best can take it, then best and the
    comparisons the issue's targets need, then the rest (fused AdamW is already the product's
    default on GPU ranks; rows on the device wait for this measurement). `tiny` orders them so
    that every kind of row (job, best, layout, HF, bare, ops, a compiled job) runs within the CPU
    check's budget."""
    b4 = 4 * micro
    rows = {
        "baseline": Row("baseline", "job", f"reference: AdamW foreach, sdpa, not compiled, ZeRO-1, {micro}x1, host rows", reference=None),
        "fused": Row("fused", "job", "AdamW fused (`optimizer: fused`)", {"optimizer": "fused"}),
        "immediate": Row("immediate", "job", "`immediate_grad_update: true` (bf16 optimizer, fp32 grad accumulation)", {"immediate_grad_update": True}),
        "zero2": Row("zero2", "job", "ZeRO-2 (flat gradient partitions)", {"zero_stage": 2}),
        "compile": Row("compile", "job", "`compile: default` (widths rounded to 16)", {"compile": "default"}),
        "packing": Row("packing", "job", "`packing: true` (texts packed into rows, block-diagonal mask)", {"packing": True}),
        "fused_qkv": Row("fused_qkv", "job", "`fused_qkv: true` (one QKV projection: 2 tensors per layer, not 6)", {"fused_qkv": True}),
        "device_rows": Row("device_rows", "job", "`data_on_device: true` (rows cut on the GPU)", {"data_on_device": True}),
        "best": Row("best", "best", "every lever that gained >= 2% over the baseline, together"),
        "hf": Row("hf", "hf", f"`transformers.Trainer`, its default optimizer, {micro}x1", reference="best"),
        "bare": Row("bare", "bare", "bare DeepSpeed loop on best's levers (text_bench --levers)", reference="best"),
        "baseline_4x": Row("baseline_4x", "job", f"batch {b4}x1", {"batch_size": b4}, scale=4),
        "best_4x": Row("best_4x", "best", f"best's levers at global batch {b4}", reference="baseline_4x", scale=4),
        "cudagraphs": Row("cudagraphs", "job", "`compile: reduce-overhead` (CUDA graphs)", {"compile": "reduce-overhead"}),
        "eager": Row("eager", "job", "`attention: eager`", {"attention": "eager"}),
        "accum": Row("accum", "job", f"{micro}x4 instead of {b4}x1", {"batch_size": micro, "gradient_accumulation_steps": 4}, reference="baseline_4x", scale=4),
        "group": Row("group", "job", "`group_by_length: true` over 4 micro-batches", {"group_by_length": True}, reference="accum", scale=4),
        "ops": Row("ops", "ops", "aten ops and kernels per optimizer step", reference=None),
        "hf_4x": Row("hf_4x", "hf", f"`transformers.Trainer` at {b4}x1", reference="best_4x", scale=4),
        "flash": Row("flash", "job", "`attention: flash_attention_2`", {"attention": "flash_attention_2"}),
    }  # fmt: skip
    order = (
        "baseline immediate fused packing fused_qkv zero2 best hf bare baseline_4x accum group best_4x ops "
        "compile eager hf_4x cudagraphs device_rows flash"
        if tiny
        else "baseline immediate packing fused_qkv compile cudagraphs fused zero2 best hf bare device_rows "
        "baseline_4x best_4x eager accum group ops hf_4x flash"
    )
    return [rows[name] for name in order.split()]


def settings_of(row: Row, rows: dict[str, Row], micro: int) -> dict[str, Any]:
    """A job row's full settings: its reference's with its switch over them."""
    if row.kind != "job":
        raise ValueError(f"{row.name} is a {row.kind} row: its settings are chosen when it runs")
    base = (
        baseline_settings(micro) if row.reference is None else settings_of(rows[row.reference], rows, micro)
    )
    return {**base, **row.switch}


def best_settings(
    gains: dict[str, float], micro: int, scale: int, threshold: float = GAIN_THRESHOLD
) -> tuple[dict[str, Any], list[str]]:
    """The baseline's settings at `scale` x `micro` with every lever whose row gained at least
    `threshold` over its reference (`gains`: throughput ratios of the rows measured so far; a
    lever not measured yet stays off). Of levers that exclude each other (two compile modes, two
    attention kernels, immediate_grad_update which needs ZeRO-1 vs ZeRO-2) the larger gain wins.
    At a larger global batch the layout too: micro x accumulation when that row gained over
    `scale*micro` x 1, and then group_by_length when it gained over that. Returns the settings and
    the rows whose levers they take."""
    settings = {**baseline_settings(micro), "batch_size": micro * scale}
    helped = {name: gain for name, gain in gains.items() if gain >= 1 + threshold}
    chosen: list[str] = []
    exclusive = (("compile", "cudagraphs"), ("eager", "flash"), ("immediate", "zero2"))
    alone = ("fused", "device_rows", "packing", "fused_qkv")
    winners = [max(group, key=lambda n: helped.get(n, 0.0)) for group in exclusive]
    for name in [*alone, *winners]:
        if name in helped:
            chosen.append(name)
    switches = {
        "fused": {"optimizer": "fused"},
        "device_rows": {"data_on_device": True},
        "packing": {"packing": True},
        "fused_qkv": {"fused_qkv": True},
        "compile": {"compile": "default"},
        "cudagraphs": {"compile": "reduce-overhead"},
        "eager": {"attention": "eager"},
        "flash": {"attention": "flash_attention_2"},
        "immediate": {"immediate_grad_update": True},
        "zero2": {"zero_stage": 2},
    }
    for name in chosen:
        settings.update(switches[name])
    if scale > 1 and "accum" in helped:
        settings.update(batch_size=micro, gradient_accumulation_steps=scale)
        chosen.append("accum")
        if "group" in helped:
            settings["group_by_length"] = True
            chosen.append("group")
    return settings, chosen


# How the start event's `speed` (read off the engine) shows each switch in force.
IN_FORCE = {
    "optimizer": lambda value, speed: speed.get("fused_optimizer") == (value == "fused"),
    "attention": lambda value, speed: speed.get("attention") == value,
    "compile": lambda value, speed: speed.get("compiled") == (value != "none"),
    "fused_qkv": lambda value, speed: bool(speed.get("fused_qkv")) == value,
    "immediate_grad_update": lambda value, speed: speed.get("immediate_grad_update") == value,
    "group_by_length": lambda value, speed: speed.get("group_by_length") == value,
    "packing": lambda value, speed: bool(speed.get("packing")) == value,
    "data_on_device": lambda value, speed: speed.get("data_on_device") == value,
}


def not_in_force(settings: dict[str, Any], speed: dict[str, Any] | None) -> list[str]:
    """The switches the config asked for that the engine does not run (e.g. immediate_grad_update
    in fp32, where DeepSpeed's bf16 optimizer is not used); none when the event said nothing."""
    if not speed:
        return []
    return [key for key, shown in IN_FORCE.items() if not shown(settings[key], speed)]


def differences(a: dict[str, Any], b: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


# -- the config -----------------------------------------------------------------------------------


def base_config(encoder: Path, gpu: bool) -> dict[str, Any]:
    """support_tickets_finetune reading its text alone (the Trainer's side has no tabular path),
    one epoch, a tenth of the rows held out (the end scores fewer rows), checkpoints never due
    inside the loop (a save stalls it for seconds)."""
    config = yaml.safe_load((REPO / "dags/configs/support_tickets_finetune.yaml").read_text())
    config["data"]["features"] = {"text": ["subject", "body"]}
    config["data"]["holdout"]["fraction"] = 0.1
    config["features"] = {"text": config["features"]["text"]}
    config["evaluation"] = {}
    config["gate"].pop("slice_guardrail", None)
    training = config["training"]
    training["pretrained"] = encoder.as_uri()
    training["hyperparameters"].update(epochs=1)
    training["resources"] = {"gpus_per_node": 1 if gpu else 0, "processes_per_node": 1}
    training["checkpoint"]["every_steps"] = 1_000_000
    return config


def row_config(
    base: dict[str, Any], settings: dict[str, Any], max_steps: int, precision: str = "auto"
) -> str:
    """The config text of one row: `base` with `settings` (levers, ZeRO stage, layout)."""
    config = copy.deepcopy(base)
    training = config["training"]
    training["hyperparameters"].update(
        max_steps=max_steps,
        batch_size=settings["batch_size"],
        gradient_accumulation_steps=settings["gradient_accumulation_steps"],
    )
    training["deepspeed"] = {"zero_stage": settings["zero_stage"], "precision": precision}
    training["speed"] = {k: settings[k] for k in SPEED_KEYS}
    return yaml.safe_dump(config, sort_keys=False)


def steps_for(settings: dict[str, Any], micro: int, tiny: bool) -> tuple[int, int]:
    """(max_steps, warm-up steps) of a job row: the window is from the first sync at or after the
    warm-up to the last. The job syncs every 10 steps at first, then every 1-10 (the largest
    divisor of 10 whose steps fit in a second); compiling takes the first steps and new widths
    recompile, so a compiled row warms up longer."""
    compiled = settings["compile"] != "none"
    large = settings["batch_size"] * settings["gradient_accumulation_steps"] > micro
    steps = (20 if large else 30) if tiny else (30 if large else 50)
    warmup = 20 if compiled else 10
    return steps + (warmup - 10), warmup


def skip_reason(settings: dict[str, Any], gpu: bool) -> str | None:
    """Why a job row cannot run here: GPU-only values on CPU (the loader's own words), or
    flash-attn's kernels without the package."""
    from airflow_trainpipe.config.speed import SpeedSection, gpu_only

    if not gpu:
        refused = gpu_only(SpeedSection(**{k: settings[k] for k in SPEED_KEYS}))
        if refused:
            return "GPU only: " + "; ".join(message for _, message in refused)
    if settings["attention"] == "flash_attention_2" and importlib.util.find_spec("flash_attn") is None:
        return "the flash-attn package is not installed here (`import flash_attn` fails)"
    return None


# -- measuring ------------------------------------------------------------------------------------


def steady(progress: list[tuple[float, int]], warmup: int) -> dict[str, Any] | None:
    """The loop's steady ms/step from (arrival time s, step) of its progress events: the time
    from the first sync at or after step `warmup` to the last, over the steps between; each
    interval's ms/step beside it (a recompile or a stall shows as one long interval). None with
    fewer than two syncs after the warm-up."""
    after = sorted((s, t) for t, s in progress if s >= warmup)
    if len(after) < 2 or after[-1][0] == after[0][0]:
        return None
    (s0, t0), (s1, t1) = after[0], after[-1]
    intervals = [1000 * (tb - ta) / (sb - sa) for (sa, ta), (sb, tb) in itertools.pairwise(after) if sb > sa]
    return {
        "ms_per_step": 1000 * (t1 - t0) / (s1 - s0),
        "from_step": s0,
        "to_step": s1,
        "syncs": len(after),
        "median_interval_ms": statistics.median(intervals),
        "max_interval_ms": max(intervals),
    }


def estimate_s(row: Row, compiled: bool, walls: dict[str, list[float]], priors: dict[str, float]) -> float:
    """Seconds a row will take: the mean of the rows of its kind run so far (the first job's
    first-time costs left out once there are others), else a prior; compiling adds its prior."""
    kind = "job" if row.kind == "best" else row.kind
    done = walls.get(kind, [])
    if kind == "job" and len(done) > 1:
        done = done[1:]
    base = statistics.mean(done) if done else priors[kind]
    return base + (priors["compile"] if compiled else 0.0)


def budget_reason(elapsed: float, estimate: float, budget_s: float) -> str | None:
    if elapsed + estimate > budget_s:
        return f"budget: {elapsed:.0f} s used of {budget_s:.0f}, this row needs ~{estimate:.0f} s"
    return None


def earlier_rows(lines: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The rows an earlier call measured, from its log's `LEVERS row NAME {json}` lines: those
    that ran (not skipped, not failed), the last line of a name winning. A second call of a
    lease reuses them, so that best, the HF Trainer and the bare loop see every lever measured
    so far, not only this call's."""
    found: dict[str, dict[str, Any]] = {}
    for line in lines:
        if not line.startswith("LEVERS row "):
            continue
        name, _, payload = line[len("LEVERS row ") :].partition(" ")
        try:
            record = json.loads(payload)
        except json.JSONDecodeError:  # a line cut short when the call was killed
            continue
        if "skipped" in record or "failed" in record:
            continue
        for key in ("elapsed_s", "mfu"):  # the earlier call's clock; mfu is computed again
            record.pop(key, None)
        found[name] = {**record, "earlier": True}
    return found


def gain(found: dict[str, dict[str, Any]], name: str, reference: str | None) -> float | None:
    """Throughput of `name` over its reference's (samples/s: the same at any global batch)."""
    a, b = found.get(name, {}), found.get(reference or "", {})
    if a.get("samples_per_s") and b.get("samples_per_s"):
        return float(a["samples_per_s"] / b["samples_per_s"])
    return None


class TimedJob(_Job):
    """`trainpipe train CONFIG --run-id RUN` as a user runs it (gpu_job's Job), each line
    timestamped as it arrives, the job's events printed raw beside the CLI's own lines (the
    `--trainpipe` entry below: the CLI with its watcher also printing each event line)."""

    def __init__(self, config: Path, run_id: str, env: dict[str, str]):
        command = [sys.executable, str(Path(__file__).resolve()), "--trainpipe", "train", str(config),
                   "--run-id", run_id, "--ds", f"{DAY}", "-v"]  # fmt: skip
        self.started = time.monotonic()
        self.process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, start_new_session=True)  # fmt: skip
        self.lines: list[str] = []
        self.stamped: list[tuple[float, dict[str, Any]]] = []  # (arrival s since start, event)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        from airflow_trainpipe.contracts.events import parse

        assert self.process.stdout is not None
        for line in self.process.stdout:
            now = time.monotonic() - self.started
            self.lines.append(line.rstrip("\n"))
            if (event := parse(line)) is not None:
                self.stamped.append((now, event))

    def events(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, e) for t, e in self.stamped if e.get("event") == kind]


def run_job(config: Path, run_id: str, env: dict[str, str], warmup: int, timeout_s: float) -> dict[str, Any]:
    tokens = Path(env["TRAINPIPE_HOME"]) / "tokens"
    folders = set(tokens.glob("*"))
    job = TimedJob(config, run_id, env)
    try:
        code = job.process.wait(timeout=max(timeout_s, 1))
    except subprocess.TimeoutExpired:
        job.kill_every_process()
        job.wait()
        return {"failed": f"killed after {timeout_s:.0f} s (the deadline)", "tail": job.lines[-30:]}
    _, wall = job.wait()
    run_dir = job.run_dir()
    if code != 0 or run_dir is None or not (run_dir / "result.json").exists():
        return {"failed": f"exit code {code}", "tail": job.lines[-40:], "wall_s": wall}
    result = json.loads((run_dir / "result.json").read_text())
    start = job.events("start")[0][1] if job.events("start") else {}
    progress = [(t, int(e["step"])) for t, e in job.events("progress")]
    window = steady(progress, warmup)
    timing = result["timing"]
    found: dict[str, Any] = {
        "wall_s": wall,
        "speed": start.get("speed"),
        "dtype": start.get("dtype"),
        "global_batch": start.get("global_batch"),
        "startup_laps": start.get("startup"),
        "startup_s": timing["startup_s"],
        "end_s": timing["end_s"],
        "loop_s": timing["loop_s"],
        "steps": timing["steps"],
        # result.json's cross-check: training time over all steps, warm-up and syncs included
        "result_ms_per_step": 1000 * timing["train_s"] / max(timing["steps"], 1),
        "macro_f1": result["holdout_metrics"].get("macro_f1"),
        "log_loss": result["holdout_metrics"].get("log_loss"),
        "progress": progress,
        # 0: the job read the token cache filled before the first job (its key: snapshot, tokenizer)
        "new_token_cache_folders": len(set(tokens.glob("*")) - folders),
    }
    if window is None:
        found["failed"] = f"fewer than two syncs after step {warmup}: {progress}"
        return found
    found.update(window)
    found["samples_per_s"] = found["global_batch"] * 1000 / window["ms_per_step"]
    return found


# -- the prepared rows and the FLOPs ----------------------------------------------------------------


def prepare_rows(config_path: Path, global_batches: list[int], gpu: bool) -> dict[str, Any]:
    """In this process, before any job: every block of the snapshot encoded through the job's
    own encoder under the key the job uses (the snapshot's digest and the tokenizer), which fills
    the token cache every job then reads; and forward+backward FLOPs per sample, counted by
    FlopCounterMode on batches of the training rows in a seeded random order, each padded to its
    longest row (the baseline's padding: no rounding to 16, no grouping), at each global batch
    as one micro-batch. The optimizer's elementwise work is not counted (as in MFU)."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.core.storage import local_path
    from airflow_trainpipe.data.freeze import snapshot_for_date
    from airflow_trainpipe.runtime.data.blocks import BlockReader
    from airflow_trainpipe.runtime.data.prepare import fit
    from airflow_trainpipe.runtime.data.reader import data_columns
    from airflow_trainpipe.runtime.data.tokens import BlockEncoder
    from airflow_trainpipe.runtime.models import build_model
    from airflow_trainpipe.runtime.models.inputs import ModelInputs

    started = time.monotonic()
    config = load_config(str(config_path))
    manifest = snapshot_for_date(config, f"{DAY}")
    spec = TrainSpec.from_manifest(config, "levers-prepare", manifest)
    uri = config.training.pretrained
    assert uri is not None
    from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory

    directory = PretrainedDirectory(local_path(uri), uri)
    prepared = fit(spec.data_files, config.data, config.features, config.training.task, manifest,
                   pretrained=directory)  # fmt: skip
    reader = BlockReader(spec.data_files, prepared.identities, config.data, data_columns(config.data))
    encoder = BlockEncoder(reader, prepared.transform, spec.data_digest or prepared.key)
    trains = [encoder.side(block, "train") for block in prepared.blocks]
    for block in prepared.blocks:  # the holdout's rows too: the cache holds whole blocks
        encoder.side(block, "holdout")
    encoded_s = time.monotonic() - started
    transform = prepared.transform
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    dtype = torch.bfloat16 if gpu and torch.cuda.is_bf16_supported() else torch.float32
    torch.manual_seed(0)
    model = build_model("text_encoder", inputs=ModelInputs.of(transform), task="multiclass_classification",
                        num_outputs=transform.num_outputs, pretrained=str(directory.path),
                        **config.training.hyperparameters.model_args).to(device, dtype)  # fmt: skip
    model.train()
    x = torch.from_numpy(np.concatenate([f for _, f in trains])).to(device)
    y = torch.from_numpy(np.concatenate([transform.labels(t) for t, _ in trains])).long().to(device)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(7)).to(device)
    per_sample: dict[int, float] = {}
    widths: dict[int, float] = {}
    for batch in global_batches:
        counted, samples, seen = 0, 0, []
        for k in range(max(2, min(8, len(y) // batch))):
            index = order[k * batch : (k + 1) * batch]
            if len(index) < batch:
                break
            with FlopCounterMode(display=False) as counter:
                loss = torch.nn.functional.cross_entropy(model(x[index]).float(), y[index])
                loss.backward()
            counted += counter.get_total_flops()
            samples += len(index)
            seen.append(
                float(model.mapping(x[index])["text"][transform.text[0]["name"]]["input_ids"].shape[1])
            )
            model.zero_grad(set_to_none=True)
        per_sample[batch] = counted / max(samples, 1)
        widths[batch] = statistics.mean(seen) if seen else float("nan")
    parameters = sum(p.numel() for p in model.parameters())
    del model, x, y, order
    gc.collect()
    if gpu:
        torch.cuda.empty_cache()
    return {
        "flops_per_sample": per_sample,
        "mean_width": widths,
        "parameters": parameters,
        "train_rows": prepared.train_rows,
        "encoded_s": encoded_s,
        "tokenized_blocks": encoder.tokenized,
        "cache": str(encoder.folder),
        "s": time.monotonic() - started,
    }


# -- the workers ----------------------------------------------------------------------------------


def write_spec(home: Path, name: str, text: str, files: list[str]) -> Path:
    from airflow_trainpipe.config import parse_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec

    path = home / "specs" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(TrainSpec(config=parse_config(text), run_id=name, data_files=files).to_json())
    return path


def torchrun(args: list[str], timeout_s: float) -> str:
    """One rank under torchrun; its stdout, or RuntimeError with the tail of its output."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=os.environ.copy(), timeout=max(timeout_s, 1)
        )
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"killed after {timeout_s:.0f} s (the deadline)") from exc
    if done.returncode != 0:
        raise RuntimeError(f"exit code {done.returncode}: {rank_error(done.stderr) or done.stdout[-1500:]}")
    return done.stdout


def rank_error(stderr: str) -> str:
    """The rank's own traceback (the first), not torchrun's report of it that follows."""
    at = stderr.find("Traceback (most recent call last)")
    if at < 0:
        return stderr[-1500:]
    end = stderr.find("Traceback (most recent call last)", at + 1)
    block = stderr[at : end if end > 0 else None].strip().splitlines()
    return "\n".join([*block[:3], "...", *block[-8:]]) if len(block) > 11 else "\n".join(block)


def tagged(out: str, tag: str) -> Any:
    return json.loads(out.split(f"{tag} ", 1)[1].splitlines()[0])


def run_hf(spec: Path, global_batch: int, tiny: bool, timeout_s: float) -> dict[str, Any]:
    warmup, timed = (2, 6) if tiny else (5, 30)
    out = torchrun([str(REPO / "benchmarks/pretrained_bench.py"), "--hf-worker", str(spec),
                    str(warmup + timed + 1), str(warmup)], timeout_s)  # fmt: skip
    hf = tagged(out, "HF")
    return {**hf, "samples_per_s": global_batch * 1000 / hf["ms_per_step"], "warmup": warmup}


def run_bare(spec: Path, global_batch: int, tiny: bool, timeout_s: float) -> dict[str, Any]:
    blocks, steps = (4, 3) if tiny else (6, 15)
    out = torchrun([str(REPO / "benchmarks/text_bench.py"), "--worker", str(spec), str(blocks), str(steps),
                    "--levers"], timeout_s)  # fmt: skip
    step = tagged(out, "STEP")
    flops = tagged(out, "FLOPS") if "FLOPS " in out else {}
    return {
        **step,
        "flops_per_sample": flops.get("per_sample"),
        "blocks": blocks,
        "block_steps": steps,
        "bare_samples_per_s": global_batch / step["bare"],
        "ours_samples_per_s": global_batch / step["ours"],
    }


def run_ops(home: Path, specs: dict[str, str], files: list[str], timeout_s: float) -> dict[str, Any]:
    path = home / "specs" / "ops.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({name: write_spec(home, f"ops_{name}", text, files).read_text()
                                for name, text in specs.items()}))  # fmt: skip
    out = torchrun([str(Path(__file__).resolve()), "--ops-worker", str(path), "3"], timeout_s)
    found: dict[str, Any] = {}
    for line in out.splitlines():
        if line.startswith("OPS "):
            found.update(json.loads(line[4:]))
    return found


def _ops_worker(specs_file: str, steps: int) -> None:
    """Each variant's engine built as the job builds it (`build_engine` with its levers, the
    model under `model_construction`), 2 warm-up steps, then torch.profiler over `steps` steps:
    the aten operators the host dispatches per optimizer step (outermost ones: what Python and
    DeepSpeed call), those inside `engine.step()` and, on a GPU, the kernels launched."""
    import numpy as np
    import torch

    from airflow_trainpipe.contracts.train_spec import TrainSpec

    specs = {
        name: TrainSpec.from_json(text) for name, text in json.loads(Path(specs_file).read_text()).items()
    }
    first = next(iter(specs.values()))
    on_gpu = torch.cuda.is_available() and first.config.training.resources.gpus_per_node > 0
    if not on_gpu:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch.distributed as dist
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    from airflow_trainpipe.core.storage import local_path
    from airflow_trainpipe.runtime.data.blocks import BlockReader
    from airflow_trainpipe.runtime.data.prepare import fit
    from airflow_trainpipe.runtime.data.reader import data_columns
    from airflow_trainpipe.runtime.data.tokens import BlockEncoder
    from airflow_trainpipe.runtime.engine import (
        build_engine,
        compute_dtype,
        deepspeed_config,
        input_dtype,
        model_construction,
    )
    from airflow_trainpipe.runtime.models import build_model
    from airflow_trainpipe.runtime.models.inputs import ModelInputs, text_lengths, text_widths
    from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory

    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    uri = first.config.training.pretrained
    assert uri is not None
    directory = PretrainedDirectory(local_path(uri), uri)
    data = first.config.data
    prepared = fit(
        first.data_files, data, first.config.features, first.config.training.task, pretrained=directory
    )
    transform = prepared.transform
    reader = BlockReader(first.data_files, prepared.identities, data, data_columns(data))
    encoder = BlockEncoder(reader, transform, prepared.key)
    sides = [encoder.side(block, "train") for block in prepared.blocks[:2]]
    host_x = np.concatenate([f for _, f in sides])
    host_y = np.concatenate([transform.labels(t) for t, _ in sides])
    inputs = ModelInputs.of(transform)
    lengths = text_lengths(host_x, inputs)
    for name, spec in specs.items():
        hp = spec.hyperparameters
        levers = spec.config.training.speed.for_rank(on_gpu)
        ds_config = deepspeed_config(spec, hp.batch_size, 1, universal=False, on_gpu=on_gpu)
        torch.manual_seed(hp.seed)
        with model_construction(ds_config):
            model = build_model("text_encoder", inputs=inputs, task="multiclass_classification",
                                num_outputs=transform.num_outputs, pretrained=str(directory.path),
                                attention=levers.attention, **hp.model_args)  # fmt: skip
        engine = build_engine(model, spec, ds_config, lambda _: 1.0, levers)
        dtype = input_dtype(engine, compute_dtype(ds_config))
        engine.train()
        batch = hp.batch_size

        def step(k: int, engine: Any = engine, dtype: Any = dtype, batch: int = batch) -> None:
            at = (k * batch) % (len(host_y) - batch)
            x = torch.from_numpy(host_x[at : at + batch]).to(device, dtype)
            y = torch.from_numpy(host_y[at : at + batch]).long().to(device)
            widths = text_widths(lengths[at : at + batch], inputs)
            with record_function("levers::forward_backward"):
                engine.backward(torch.nn.functional.cross_entropy(engine(x, widths=widths).float(), y))
            with record_function("levers::optimizer_step"):
                engine.step()

        for k in range(2):
            step(k)
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
        with profile(activities=activities) as prof:
            for k in range(2, 2 + steps):
                step(k)
            if on_gpu:
                torch.cuda.synchronize()
        # Every thread's ops count (a GPU's backward runs on autograd's device thread, outside
        # the labels); "in engine.step()": under its label.
        counts = {"ops": 0, "ops_in_step": 0, "kernels": 0, "launches_in_step": 0}
        for event in prof.events():
            if event.device_type == DeviceType.CUDA:
                counts["kernels"] += 1
                continue
            parent, in_step = event.cpu_parent, False
            outermost = event.name.startswith("aten::")
            while parent is not None:
                outermost = outermost and not parent.name.startswith("aten::")
                in_step = in_step or parent.name == "levers::optimizer_step"
                parent = parent.cpu_parent
            counts["ops"] += outermost
            counts["ops_in_step"] += outermost and in_step
            counts["launches_in_step"] += in_step and event.name.startswith(("cudaLaunch", "cuLaunch"))
        per_step = {k: v / steps for k, v in counts.items()}
        tensors = sum(1 for p in engine.module.parameters() if p.requires_grad)
        print("OPS " + json.dumps({name: {**per_step, "parameter_tensors": tensors, "optimizer": type(engine.optimizer).__name__,
                                          "device": str(device)}}), flush=True)  # fmt: skip
        del engine, model
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    dist.destroy_process_group()


# -- the section ----------------------------------------------------------------------------------


def ran(speed: dict[str, Any] | None) -> str:
    """The start event's `speed` (read off the engine) in a few words."""
    if not speed:
        return "-"
    words = ["fused" if speed.get("fused_optimizer") else "foreach", str(speed.get("attention") or "?")]
    words += [label for key, label in (("compiled", "compiled"), ("fused_qkv", "fused QKV"), ("immediate_grad_update", "immediate"),
              ("group_by_length", "grouped"), ("packing", "packed"), ("data_on_device", "device rows"))
              if speed.get(key)]  # fmt: skip
    return ", ".join(words)


def layout(settings: dict[str, Any]) -> str:
    return f"{settings['batch_size']}x{settings['gradient_accumulation_steps']}"


def mfu(row: dict[str, Any], flops: dict[int, float], peak: float) -> float | None:
    batch = row.get("global_batch")
    if not row.get("samples_per_s") or batch not in flops or peak != peak:  # peak NaN on CPU
        return None
    return float(row["samples_per_s"] * flops[batch] / peak)


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def _num(value: Any, spec: str = ".1f") -> str:
    return "-" if value is None else format(value, spec)


def section(found: dict[str, Any], command: str) -> list[str]:
    """The Markdown section from what the run found (any part may be missing: a run cut short)."""
    rows: dict[str, dict[str, Any]] = found["rows"]
    flops = {int(k): v for k, v in found.get("prepared", {}).get("flops_per_sample", {}).items()}
    peak = found["peak"]
    micro = found["micro"]
    lines = [
        SECTION,
        "",
        f"_Measured {found['when']} on {found['device']} ({found['cores']} cores; {found['versions']}), by `{command}`"
        f" ({found['wall_s']:.0f} s)._",
        "",
        f"The product's job, `trainpipe train` once per row (a new run id each): `support_tickets_finetune` reading"
        f" its text alone (subject+body, at most 96 tokens, dynamic padding), fine-tuning a"
        f" {found.get('prepared', {}).get('parameters', float('nan')) / 1e6:.1f}M-parameter encoder directory"
        f" ({found['shape']['layers']} layers, hidden {found['shape']['hidden_size']}, FFN"
        f" {found['shape']['intermediate_size']}), {found['rows_total']:,} tickets (10% held out), one rank,"
        f" precision auto ({found.get('dtype') or '?'}), `max_steps` {found['steps_note']}, no checkpoint inside the loop."
        " ms/step: the steady loop, from the job's first sync at or after the warm-up (10 steps; 20 compiled) to its"
        " last, timed by the arrival of its `progress` events (each sent after the steps' losses reached the host);"
        " result.json ms/step: the job's training time over all its steps (warm-up and syncs included), the cross-check."
        " MFU: samples/s x the forward+backward FLOPs per sample counted by FlopCounterMode at the baseline's padding"
        f" ({', '.join(f'{v / 1e9:.2f} GFLOP at batch {k}' for k, v in sorted(flops.items())) or 'not counted'})"
        + (
            f" / {peak / 1e12:.0f} TFLOP/s (data sheet, dense bf16)."
            if peak == peak
            else ": no data-sheet peak for this device, no MFU."
        )
        + " Rows that pad differently (compiled: widths rounded"
        " to 16; grouped: each micro-batch to its own rows) do more or fewer FLOPs than that: their MFU counts the"
        " baseline's work, i.e. useful work, and samples/s is the plain throughput. Gain: samples/s over the row"
        " named as reference.",
        "",
        "| row | what changed (reference) | start event: what ran | layout | ms/step | median interval | result.json ms/step | samples/s | MFU | gain | start-up s | end s | holdout macro-F1 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        if row.get("kind") not in ("job", "best"):
            continue
        reference = row.get("reference")
        changed = row["changed"] + (f" ({reference})" if reference else "")
        if "skipped" in row:
            lines.append(f"| {name} | {changed} | skipped: {row['skipped']} |" + " |" * 10)
            continue
        if row.get("failed"):
            failed = str(row["failed"]).replace("\n", " ").replace("|", "/")[:300]
            lines.append(f"| {name} | {changed} | failed: {failed} | {layout(row['settings'])} |" + " |" * 9)
            continue
        g = gain(rows, name, reference)
        asked = f"; asked, not in force: {', '.join(row['not_in_force'])}" if row.get("not_in_force") else ""
        lines.append(
            f"| {name} | {changed} | {ran(row.get('speed'))}; {row.get('dtype')}, ZeRO-{row['settings']['zero_stage']}{asked} "
            f"| {layout(row['settings'])} | {row['ms_per_step']:.1f} | {row['median_interval_ms']:.1f} "
            f"| {row['result_ms_per_step']:.1f} | {row['samples_per_s']:,.0f} | {_pct(mfu(row, flops, peak))} "
            f"| {_num(g, '.3f')} | {row['startup_s']:.1f} | {row['end_s']:.1f} | {_num(row.get('macro_f1'), '.4f')} |"
        )
    for name in ("best", "best_4x"):
        if rows.get(name, {}).get("chosen") is not None:
            unmeasured = rows[name].get("unmeasured")
            lines += [
                "",
                f"{name} took: {', '.join(rows[name]['chosen']) or 'no lever (none gained 2%)'}"
                + (f"; not measured when it ran, so left out: {', '.join(unmeasured)}" if unmeasured else "")
                + ".",
            ]
    jobs = [r for r in rows.values() if "new_token_cache_folders" in r]
    if jobs:
        fresh = sum(r["new_token_cache_folders"] for r in jobs)
        lines += [
            "",
            f"Token cache: filled once before the first job; {len(jobs)} jobs ran and "
            + ("none tokenized the snapshot again." if not fresh else f"{fresh} wrote a cache of their own."),
        ]
    lines += ["", *comparison_lines(found, flops, peak, micro), "", *ops_lines(rows.get("ops", {}))]
    earlier = [n for n, r in rows.items() if r.get("earlier")]
    if earlier:
        lines += [
            "",
            f"Measured by an earlier call (`--earlier`, read from its log, on that call's machine): {', '.join(earlier)}.",
        ]
    skipped = [f"{n} ({r['skipped']})" for n, r in rows.items() if "skipped" in r]
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped) + "."]
    return [*lines, ""]


def comparison_lines(found: dict[str, Any], flops: dict[int, float], peak: float, micro: int) -> list[str]:
    rows = found["rows"]
    best, best4, hf, hf4, bare = (rows.get(n, {}) for n in ("best", "best_4x", "hf", "hf_4x", "bare"))
    lines = ["| comparison | measured | target |", "|---|---|---|"]

    def ratio(a: Any, b: Any) -> float | None:
        return float(a / b) if a and b else None

    def verdict(value: float | None, target: float) -> str:
        return "not measured" if value is None else ("met" if value >= target else "not met")

    mfu_b, mfu_4b = mfu(best, flops, peak), mfu(best4, flops, peak)
    vs_hf = ratio(best.get("samples_per_s"), hf.get("samples_per_s"))
    vs_hf4 = ratio(best4.get("samples_per_s"), hf4.get("samples_per_s"))
    vs_bare = ratio(best.get("samples_per_s"), bare.get("bare_samples_per_s"))
    worker = ratio(bare.get("bare"), bare.get("ours"))
    lines += [
        f"| MFU, best at batch {micro} | {_pct(mfu_b)} | >= 35%: {verdict(mfu_b, TARGETS['mfu_b'])} |",
        f"| MFU, best at batch {4 * micro} | {_pct(mfu_4b)} | >= 45%: {verdict(mfu_4b, TARGETS['mfu_4b'])} |",
        f"| job (best) / HF Trainer, samples/s, batch {micro} | {_num(vs_hf, '.3f')} | >= 1.2: {verdict(vs_hf, TARGETS['vs_hf'])} |",
        f"| job (best_4x) / HF Trainer, batch {4 * micro} | {_num(vs_hf4, '.3f')} | >= 1.2: {verdict(vs_hf4, TARGETS['vs_hf'])} |",
        f"| job (best) / bare loop on best's levers, samples/s | {_num(vs_bare, '.3f')} | >= 1.0: {verdict(vs_bare, TARGETS['vs_bare'])} |",
        f"| StepRunner / bare in text_bench's worker (one engine, alternating blocks) | {_num(worker, '.3f')} | >= 1.0: {verdict(worker, TARGETS['vs_bare'])} |",
        "",
    ]
    if hf.get("ms_per_step"):
        lines.append(
            f"HF Trainer (pretrained_bench `_hf_worker`: the same model built as the job builds it, the same rows"
            f" as int64 ids, the same DeepSpeed config, its default optimizer): {hf['ms_per_step']:.1f} ms/step at"
            f" batch {micro} ({hf['samples_per_s']:,.0f} samples/s, median of {hf['steps']} steps after"
            f" {hf['warmup']}; its clock synchronizes the GPU at each step end)"
            + (f"; {hf4['ms_per_step']:.1f} ms/step at {4 * micro}" if hf4.get("ms_per_step") else "")
            + "."
        )
    if bare.get("bare"):
        lines.append(
            f"Bare DeepSpeed loop (text_bench `--worker ... --levers`: the engine built with best's levers, rows"
            f" held on the device, widths counted on the host): {1000 * bare['bare']:.1f} ms/step, its StepRunner"
            f" {1000 * bare['ours']:.1f} ({bare['blocks']} alternating blocks of {bare['block_steps']} steps,"
            f" medians; mean padded width ours {bare.get('width_ours', float('nan')):.1f}, bare"
            f" {bare.get('width_bare', float('nan')):.1f}; FlopCounterMode in that worker"
            f" {_num((bare.get('flops_per_sample') or 0) / 1e9 or None, '.2f')} GFLOP/sample)."
        )
    return lines


def ops_lines(ops: dict[str, Any]) -> list[str]:
    variants = ops.get("variants") or {}
    if not variants:
        reason = ops.get("skipped") or ops.get("failed") or "not run"
        return [f"Op counts per optimizer step: {str(reason)[:300]}."]
    lines = [
        f"Op counts per optimizer step ({ops.get('note', '')}): outermost aten operators the host"
        " dispatches (each at least one kernel launch on a GPU), those inside `engine.step()`, and GPU kernels.",
        "",
        "| variant | DeepSpeed optimizer | parameter tensors | aten ops / step | in engine.step() | kernels / step | launches in engine.step() |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, v in variants.items():
        gpu = str(v.get("device", "")).startswith("cuda")
        kernels = f"{v['kernels']:.0f} | {v['launches_in_step']:.0f}" if gpu else "- (CPU) | -"
        lines.append(
            f"| {name} | {v['optimizer']} | {v['parameter_tensors']} | {v['ops']:.0f} | {v['ops_in_step']:.0f} | {kernels} |"
        )
    return lines


# -- the run --------------------------------------------------------------------------------------


def _versions() -> str:
    from importlib.metadata import version

    import torch

    found = [f"Python {sys.version.split()[0]}", f"torch {torch.__version__}"]
    for name in ("deepspeed", "transformers", "mlflow-skinny", "mlflow", "flash-attn"):
        with contextlib.suppress(Exception):
            found.append(f"{name} {version(name)}")
    return ", ".join(found)


@dataclass
class Run:
    """What the run keeps between rows."""

    args: argparse.Namespace
    home: Path
    env: dict[str, str]
    gpu: bool
    micro: int
    base: dict[str, Any]
    files: list[str]
    started: float
    priors: dict[str, float]
    found: dict[str, dict[str, Any]] = field(default_factory=dict)
    walls: dict[str, list[float]] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def left(self) -> float:
        return self.args.deadline_s - self.elapsed()

    def gains(self, rows: dict[str, Row]) -> dict[str, float]:
        """Each measured lever row's gain over its reference; a row whose lever the start event
        shows not in force gained nothing from it."""
        found = {}
        for name, row in rows.items():
            record = self.found.get(name, {})
            if row.kind != "job" or record.get("not_in_force"):
                continue
            if (g := gain(self.found, name, row.reference)) is not None:
                found[name] = g
        return found


def run_row(run: Run, row: Row, rows: dict[str, Row]) -> dict[str, Any]:
    tiny, gpu = run.args.tiny, run.gpu
    record: dict[str, Any] = {"kind": row.kind, "changed": row.changed, "reference": row.reference}
    settings: dict[str, Any] | None = None
    if row.kind == "job":
        settings = settings_of(row, rows, run.micro)
    elif row.kind == "best":
        settings, record["chosen"] = best_settings(run.gains(rows), run.micro, row.scale)
        # The lever rows best could take (at 4x the batch the layout's too), not the batch size itself.
        levers = [
            n
            for n, r in rows.items()
            if r.kind == "job" and set(r.switch) - {"batch_size"} and r.scale <= row.scale
        ]
        record["unmeasured"] = [name for name in levers if not run.found.get(name, {}).get("samples_per_s")]
    elif row.kind == "bare":  # best's levers at the baseline's batch: like with like
        settings = best_settings(run.gains(rows), run.micro, 1)[0]
    elif row.kind == "hf":  # the Trainer picks its own optimizer and kernels; the layout is ours
        settings = {**baseline_settings(run.micro), "batch_size": run.micro * row.scale}
    if settings is not None:
        record["settings"] = settings
        if (reason := skip_reason(settings, gpu)) is not None:
            return {**record, "skipped": reason}
    if run.args.only and row.name not in run.args.only:
        return {**record, "skipped": "not in --only"}
    compiled = settings is not None and settings["compile"] != "none"
    estimate = estimate_s(row, compiled, run.walls, run.priors)
    if (reason := budget_reason(run.elapsed(), estimate, run.args.budget_s)) is not None:
        return {**record, "skipped": reason}
    started = time.monotonic()
    kind = "job" if row.kind == "best" else row.kind
    try:
        if kind == "job":
            assert settings is not None
            steps, warmup = steps_for(settings, run.micro, tiny)
            config = run.home / "configs" / f"{row.name}.yaml"
            config.parent.mkdir(parents=True, exist_ok=True)
            config.write_text(row_config(run.base, settings, steps))
            record.update(max_steps=steps, warmup=warmup)
            record.update(
                run_job(config, f"levers-{row.name}", run.env, warmup, min(run.priors["timeout"], run.left()))
            )
            record["not_in_force"] = not_in_force(settings, record.get("speed"))
        elif kind in ("hf", "bare"):
            assert settings is not None
            spec = write_spec(run.home, row.name, row_config(run.base, settings, 1_000_000), run.files)
            measure = run_hf if kind == "hf" else run_bare
            record.update(measure(spec, run.micro * row.scale, tiny, min(run.priors["timeout"], run.left())))
        else:
            record.update(ops_row(run))
    except Exception as exc:  # one row failing must not lose the others
        record["failed"] = f"{type(exc).__name__}: {str(exc)[-1500:]}"
    run.walls.setdefault(kind, []).append(time.monotonic() - started)
    record["row_s"] = time.monotonic() - started
    return record


def ops_row(run: Run) -> dict[str, Any]:
    """The op counts: on the device the ~100M encoder on its GPU; in --tiny a 14-layer encoder as
    narrow as the tiny one (the same parameter tensors as the 100M encoder) on CPU in bf16."""
    encoder = Path(run.base["training"]["pretrained"].removeprefix("file://"))
    note = "the ~100M encoder, batch 32, on the GPU, bf16"
    precision = "auto"
    if run.args.tiny:
        from pretrained_bench import make_encoder

        encoder = make_encoder(run.home / "encoders/ops", run.files, ENCODER_OPS_TINY)
        note = f"a {ENCODER_OPS_TINY['layers']}-layer encoder of hidden {ENCODER_OPS_TINY['hidden_size']} on CPU, bf16, batch 32"
        precision = "bf16"
    base = {**run.base, "training": {**run.base["training"], "pretrained": encoder.as_uri()}}
    variants = {
        "baseline (foreach, ZeRO-1)": {},
        "fused": {"optimizer": "fused"},
        "immediate_grad_update": {"immediate_grad_update": True},
        "ZeRO-2": {"zero_stage": 2},
        "fused + ZeRO-2": {"optimizer": "fused", "zero_stage": 2},
        "fused_qkv": {"fused_qkv": True},
        "fused_qkv + immediate_grad_update": {"fused_qkv": True, "immediate_grad_update": True},
    }
    specs = {
        name: row_config(base, {**baseline_settings(32), **switch}, 1_000_000, precision)
        for name, switch in variants.items()
    }
    return {
        "variants": run_ops(run.home, specs, run.files, min(run.priors["timeout"], run.left())),
        "note": note,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, a small encoder: checks the script")
    parser.add_argument("--rows", type=int, help="tickets (default 50,000; tiny 3,000)")
    parser.add_argument("--batch", type=int, help="the baseline's micro-batch (default 256; tiny 16)")
    parser.add_argument(
        "--budget-s", type=float, help="start no row that would end past this (default 420; tiny 510)"
    )
    parser.add_argument(
        "--deadline-s", type=float, help="kill a row still running at this (default budget + 90)"
    )
    parser.add_argument(
        "--only", type=lambda s: set(s.split(",")), help="run these rows alone (comma-separated)"
    )
    parser.add_argument(
        "--earlier",
        type=Path,
        action="append",
        help="an earlier call's log (its LEVERS lines): the rows it measured are reused, not run again",
    )
    parser.add_argument("--output", type=Path, help="also write the section to this file")
    args = parser.parse_args()
    args.budget_s = args.budget_s or (510.0 if args.tiny else 420.0)
    args.deadline_s = args.deadline_s or args.budget_s + 90
    started = time.monotonic()
    rows_total, micro = (
        args.rows or (3_000 if args.tiny else 50_000),
        args.batch or (16 if args.tiny else 256),
    )
    home = Path(tempfile.mkdtemp(prefix="gpu-levers-"))
    os.environ["TRAINPIPE_HOME"] = str(home)
    from airflow_trainpipe.core.tracking_store import default_tracking_uri

    os.environ["MLFLOW_TRACKING_URI"] = default_tracking_uri()
    import torch
    from pretrained_bench import make_encoder

    from airflow_trainpipe.examples.synthetic import write_day

    gpu = torch.cuda.is_available() and not args.tiny
    device = torch.cuda.get_device_name(0) if gpu else "cpu"
    shape = ENCODER_TINY if args.tiny else ENCODER_100M
    files = write_day(
        (home / "data/support_tickets").as_uri(), DAY, rows_total, seed=11, kind="support_tickets"
    )
    encoder = make_encoder(home / "encoders/support_tickets", files, shape)
    base = base_config(encoder, gpu)
    config = home / "configs" / "prepare.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(row_config(base, baseline_settings(micro), 1_000_000))
    log(
        "setup",
        device=device,
        rows=rows_total,
        micro=micro,
        home=str(home),
        s=round(time.monotonic() - started, 1),
    )
    priors = (
        {"job": 35.0, "compile": 70.0, "hf": 30.0, "bare": 40.0, "ops": 60.0, "timeout": 400.0}
        if args.tiny
        else {"job": 55.0, "compile": 60.0, "hf": 45.0, "bare": 60.0, "ops": 45.0, "timeout": 300.0}
    )
    found: dict[str, Any] = {
        "device": device, "micro": micro, "rows_total": rows_total, "shape": shape, "peak": peak_flops(device),
        "cores": os.cpu_count(), "versions": _versions(), "rows": {},
    }  # fmt: skip
    run = Run(args, home, {**os.environ}, gpu, micro, base, files, started, priors, found["rows"])
    try:
        found["prepared"] = prepare_rows(config, [micro, 4 * micro], gpu)
        log("prepared", **found["prepared"])
    except Exception as exc:
        found["prepared"] = {"failed": f"{type(exc).__name__}: {exc}"}
        log("prepared", failed=found["prepared"]["failed"])
    flops = found["prepared"].get("flops_per_sample", {})
    plan_rows = plan(micro, args.tiny)
    by_name = {row.name: row for row in plan_rows}
    earlier: dict[str, dict[str, Any]] = {}
    for log_file in args.earlier or ():
        earlier.update(earlier_rows(log_file.read_text(errors="replace").splitlines()))
    for row in plan_rows:
        if row.name in earlier and not (args.only and row.name in args.only):
            record = earlier[row.name]  # measured by an earlier call; --only NAME measures it again
            run.walls.setdefault("job" if row.kind == "best" else row.kind, []).append(
                record.get("row_s", 0.0)
            )
        else:
            record = run_row(run, row, by_name)
        found["rows"][row.name] = record
        shown = {k: v for k, v in record.items() if k not in ("progress", "tail")}
        if record.get("global_batch") in flops:
            shown["mfu"] = mfu(record, flops, found["peak"])
        log(f"row {row.name}", **shown, elapsed_s=round(run.elapsed(), 1))
        if record.get("tail"):
            print("\n".join(record["tail"][-15:]), file=sys.stderr, flush=True)
    found["dtype"] = next((r["dtype"] for r in found["rows"].values() if r.get("dtype")), None)
    found["steps_note"] = (
        "30/20 (batch 16/64; +10 compiled)" if args.tiny else "50 at batch 256, 30 at 1024 (+10 compiled)"
    )
    found["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    found["wall_s"] = run.elapsed()
    command = "python benchmarks/gpu_levers.py" + (" --tiny" if args.tiny else "")
    lines = section(found, command)
    print("\n".join(lines), flush=True)
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")
    log(
        "done",
        wall_s=round(run.elapsed(), 1),
        skipped=[n for n, r in found["rows"].items() if "skipped" in r],
    )


def tap_events() -> None:
    """Make the CLI's job watcher also print each event line raw: the CLI shows events as
    sentences, and the start event's `speed` and the syncs' steps are read from the raw line."""
    from airflow_trainpipe.contracts.events import parse
    from airflow_trainpipe.launchers import watcher

    feed = watcher.JobWatcher.feed

    def feed_and_show(self: Any, text: str) -> str | None:
        if parse(text) is not None:
            print(text, flush=True)
        return feed(self, text)

    watcher.JobWatcher.feed = feed_and_show  # type: ignore[method-assign]


def tapped_cli(argv: list[str]) -> int:
    """`trainpipe train ...` itself (the CLI's main), its events also printed raw."""
    tap_events()
    from airflow_trainpipe.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--trainpipe":
        sys.exit(tapped_cli(sys.argv[2:]))
    if len(sys.argv) > 1 and sys.argv[1] == "--ops-worker":
        _ops_worker(sys.argv[2], int(sys.argv[3]))
        sys.stdout.flush()
        os._exit(0)  # as the job does: gloo's teardown at exit can abort after the work is done
    main()
