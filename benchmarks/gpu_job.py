"""The product's own training job on a GPU, end to end: `trainpipe train`, the entrypoint the train
task launches (torchrun around `airflow_trainpipe.runtime.train`), never a bench worker.

On one machine, in one run:
1. a day of support tickets and a ~100M-parameter encoder directory (`make-encoder`'s shape: 14
   layers, hidden 768, FFN 3072), fine-tuned by `dags/configs/support_tickets_finetune.yaml` with
   ZeRO-1, bf16 (`precision: auto`), one GPU, one epoch;
2. a straight run, then its model registered (MLflow's registry, alias `champion`);
3. a second run SIGKILLed (every process of the job) once its first checkpoint is complete, then
   the same command with the same run id: the step it resumed from, the steps it recomputed, its
   holdout metrics beside the straight run's, and its end, which scores the champion;
4. the registered model loaded back (`models:/NAME@champion`, the pyfunc a server loads) and
   scoring the holdout rows, beside the metrics the job reported for it;
5. the time split of each job (start-up / loop / end, the end phase by phase), the loop's ms per
   step beside the bench's StepRunner (text_bench's worker: same model, batch, rows, device), and
   MFU (forward+backward FLOPs per sample counted by FlopCounterMode, data-sheet bf16 peak).

On the device machine: `python benchmarks/gpu_job.py --output gpu_job.md` writes the section
`## GPU: trainpipe train end to end`; BENCHMARKS.md keeps it. `--tiny` runs the same script on
CPU with a small encoder, to check it before spending device time.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import date
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
DAY = date(2026, 1, 1)
ENCODER_100M = {"hidden_size": 768, "layers": 14, "heads": 12, "intermediate_size": 3072}
ENCODER_TINY = {"hidden_size": 64, "layers": 2, "heads": 2, "intermediate_size": 128}
PEAK_BF16 = {"H100 80GB HBM3": 989e12, "H100 PCIe": 756e12, "H200": 989e12, "A100": 312e12}


def log(what: str, **found: Any) -> None:
    """One JSON line per finding, as it is found: a run cut short still shows what it measured."""
    print(f"GPUJOB {what} " + json.dumps(found, default=str), flush=True)


def config_text(encoder: Path, batch: int, every: int, gpu: bool) -> str:
    config = yaml.safe_load((REPO / "dags/configs/support_tickets_finetune.yaml").read_text())
    training = config["training"]
    training["pretrained"] = encoder.as_uri()
    training["hyperparameters"].update(epochs=1, batch_size=batch)
    training["deepspeed"] = {"zero_stage": 1}  # one GPU: nothing to partition (ZeRO-3 pays gathers)
    training["resources"] = {"gpus_per_node": 1 if gpu else 0, "processes_per_node": 1}
    training["checkpoint"]["every_steps"] = every
    return yaml.safe_dump(config, sort_keys=False)


def trainpipe(*args: str) -> list[str]:
    """The `trainpipe` command (its console script is `python -m airflow_trainpipe.cli`)."""
    return [sys.executable, "-m", "airflow_trainpipe.cli", *args]


class Job:
    """`trainpipe train CONFIG --run-id RUN` as a user runs it, its output kept."""

    def __init__(self, config: Path, run_id: str, env: dict[str, str]):
        command = trainpipe("train", str(config), "--run-id", run_id, "--ds", f"{DAY}", "-v")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def run_dir(self) -> Path | None:
        for line in self.lines:
            if line.startswith("run directory "):
                return Path(line.removeprefix("run directory ").split(";")[0].removeprefix("file://"))
        return None

    def wait(self) -> tuple[int, float]:
        code = self.process.wait()
        self.reader.join(10)
        return code, time.monotonic() - self.started

    def kill_every_process(self) -> None:
        """SIGKILL the CLI, torchrun and every rank at once: no process gets to save."""
        import psutil

        leader = psutil.Process(self.process.pid)
        for process in [*leader.children(recursive=True), leader]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGKILL)


def result_of(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "result.json").read_text())


def straight(config: Path, env: dict[str, str]) -> dict[str, Any]:
    job = Job(config, "straight", env)
    code, wall = job.wait()
    run_dir = job.run_dir()
    if code != 0 or run_dir is None:
        raise SystemExit(f"straight run failed ({code}):\n" + "\n".join(job.lines[-80:]))
    return {"wall_s": wall, "result": result_of(run_dir), "run_dir": str(run_dir)}


def killed_then_resumed(config: Path, env: dict[str, str], every: int) -> dict[str, Any]:
    job = Job(config, "resumed", env)
    marker = None
    while job.process.poll() is None:
        run_dir = job.run_dir()
        if run_dir is not None:
            marker = run_dir / "checkpoints" / f"step_{every:09d}" / "COMPLETE.json"
            if marker.exists():
                break
        time.sleep(0.05)
    if marker is None or not marker.exists():
        raise SystemExit("no checkpoint completed before the job ended:\n" + "\n".join(job.lines[-80:]))
    job.kill_every_process()
    code, killed_wall = job.wait()
    log("killed", exit_code=code, wall_s=round(killed_wall, 1), checkpoint=str(marker.parent))
    again = Job(config, "resumed", env)
    code, wall = again.wait()
    run_dir = again.run_dir()
    if code != 0 or run_dir is None:
        raise SystemExit(f"resumed run failed ({code}):\n" + "\n".join(again.lines[-80:]))
    return {
        "killed_wall_s": killed_wall,
        "wall_s": wall,
        "result": result_of(run_dir),
        "run_dir": str(run_dir),
    }


def register(model_uri: str, name: str) -> tuple[str, float]:
    """The straight run's model as `name`'s champion: what the register task does once the gate
    passes (Airflow itself is not on the GPU image, so MLflow's client is called directly)."""
    from mlflow import MlflowClient, register_model

    started = time.monotonic()
    version = register_model(model_uri, name).version
    MlflowClient().set_registered_model_alias(name, "champion", version)
    return version, time.monotonic() - started


def served_holdout(config_path: Path, name: str, device: Any) -> dict[str, Any]:
    """The registered champion read back: as a server loads it (`mlflow.pyfunc.load_model`, on the
    CPU) for the first 1,000 holdout rows, and as the gate's next run reads a champion (its
    artifacts, the network moved to `device`) for every holdout row, with the metrics of that."""
    import tempfile

    import mlflow
    import numpy as np

    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.data.freeze import snapshot_for_date
    from airflow_trainpipe.runtime.data.reader import HoldoutSplit, read_table
    from airflow_trainpipe.runtime.evaluation.metrics import compute_metrics
    from airflow_trainpipe.runtime.serving import load_registered

    config = load_config(str(config_path))
    data = config.data
    files = snapshot_for_date(config, f"{DAY}").file_uris
    table = read_table(files, data.format, [*data.features.all, data.label, data.holdout.key_column])
    holdout = table.filter(np.asarray(HoldoutSplit(data).mask(table)))
    rows = holdout.select(data.features.all).to_pandas()
    started = time.monotonic()
    served = mlflow.pyfunc.load_model(f"models:/{name}@champion")
    load_s = time.monotonic() - started
    first = served.predict(rows.iloc[:1000])
    served_s = time.monotonic() - started - load_s
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        version = mlflow.MlflowClient().get_model_version_by_alias(name, "champion").version
        model, _ = load_registered(f"models:/{name}/{version}", folder, device)
        probabilities = model.scores(rows)  # the class columns alone, as the job scores
    device_s = time.monotonic() - started
    classes = list(first.columns.drop("predicted_label"))
    labels = np.array([classes.index(v) for v in holdout.column(data.label).to_pylist()])
    metrics = compute_metrics(
        "multiclass_classification", labels, probabilities[classes].to_numpy(np.float64), classes=classes
    )
    difference = float(np.abs(first[classes].to_numpy() - probabilities[classes].to_numpy()[:1000]).max())
    return {
        "rows": holdout.num_rows, "load_s": load_s, "served_s": served_s, "device_s": device_s,
        "macro_f1": metrics["macro_f1"], "max_abs_difference": difference, "device": str(device),
    }  # fmt: skip


def bench_step(config_path: Path, files: list[str], batch: int, tiny: bool) -> dict[str, Any]:
    """text_bench's worker on the same spec: our StepRunner vs a bare DeepSpeed loop, one engine."""
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.contracts.train_spec import TrainSpec

    config = load_config(str(config_path))
    spec = TrainSpec(config=config, run_id="bench", data_files=files)
    spec_path = config_path.with_name("bench_spec.json")
    spec_path.write_text(spec.to_json())
    blocks, steps = (4, 3) if tiny else (6, 15)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "1",
        str(REPO / "benchmarks/text_bench.py"), "--worker", str(spec_path), str(blocks), str(steps),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=os.environ.copy())
    if done.returncode != 0:
        return {"failed": (done.stdout[-2000:] + done.stderr[-4000:])}
    out = done.stdout
    step = json.loads(out.split("STEP ", 1)[1].splitlines()[0])
    flops = json.loads(out.split("FLOPS ", 1)[1].splitlines()[0])
    return {**step, **flops, "blocks": blocks, "steps": steps, "batch": batch}


def split(result: dict[str, Any]) -> dict[str, Any]:
    """A job's wall split: start-up (torchrun's start to the first step), loop, end."""
    timing = result["timing"]
    startup, loop, end = timing["startup_s"], timing["loop_s"], timing["end_s"]
    total = startup + loop + end
    steps = max(timing["steps"], 1)
    return {
        "startup_s": startup,
        "loop_s": loop,
        "end_s": end,
        "end_share": end / total,
        "steps": timing["steps"],
        "ms_per_step": 1000 * timing["train_s"] / steps,  # syncs, logging and checkpoint saves included
        "checkpoint_s": timing["checkpoint_s"],
        "eval_s": timing["eval_s"],
        "end": timing.get("end", {}),
    }


def peak_flops(device: str) -> float:
    for name, peak in PEAK_BF16.items():
        if name in device:
            return peak
    return float("nan")  # --tiny on CPU: no MFU to speak of


def section(found: dict[str, Any], command: str) -> list[str]:
    a, b = found["straight"], found["resumed"]
    sa, sb = split(a["result"]), split(b["result"])
    bench, served = found["bench"], found["served"]
    peak = peak_flops(found["device"])
    samples_per_step = found["batch"]
    lines = [
        "## GPU: trainpipe train end to end",
        "",
        f"_Measured {found['when']} on {found['device']} ({found['versions']}), by `{command}`._",
        "",
        f"The product's own job: `trainpipe train` of `dags/configs/support_tickets_finetune.yaml` (torchrun,"
        f" one rank, nccl for DeepSpeed and gloo for the job's own collectives), fine-tuning a"
        f" {found['parameters'] / 1e6:.1f}M-parameter encoder directory ({found['shape']['layers']} layers, hidden"
        f" {found['shape']['hidden_size']}, FFN {found['shape']['intermediate_size']}; `make-encoder`'s random"
        f" weights) with ZeRO-1 and {found['bench'].get('dtype', '?').removeprefix('torch.')}, batch {found['batch']}, one epoch of"
        f" {found['rows']:,} tickets (holdout 20%), a checkpoint every {found['every']} steps.",
        "",
        "| run | steps | resumed from | recomputed | start-up s | loop s | end s | end share | loop ms/step | holdout macro-F1 | log loss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, run, s in (("straight", a, sa), ("killed, then resumed", b, sb)):
        r = run["result"]
        lines.append(
            f"| {name} | {s['steps']} | {r['resumed_from_step']} | {r['steps_recomputed']} | {s['startup_s']:.1f} "
            f"| {s['loop_s']:.1f} | {s['end_s']:.1f} | **{100 * s['end_share']:.0f}%** | {s['ms_per_step']:.1f} "
            f"| {r['holdout_metrics']['macro_f1']:.4f} | {r['holdout_metrics']['log_loss']:.4f} |"
        )
    lines += [
        "",
        "Where each end went (seconds): "
        + "; ".join(
            f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in s["end"].items())
            for name, s in (("straight", sa), ("resumed", sb))
        )
        + ".",
    ]
    if "failed" in bench:
        lines += ["", "The bench worker failed: " + bench["failed"][-500:].replace("\n", " ")]
    else:
        flops = bench["per_sample"]
        mfu = {k: flops * samples_per_step / (v / 1000) / peak for k, v in (("job", sa["ms_per_step"]),
               ("ours", 1000 * bench["ours"]), ("bare", 1000 * bench["bare"]))}  # fmt: skip
        lines += [
            "",
            f"Loop vs bench, same model, rows, batch and device: the job's loop {sa['ms_per_step']:.1f} ms/step"
            f" (its training time over its steps: syncs, logging and {sa['checkpoint_s']:.1f} s of checkpoint saves"
            f" included, the epoch-end evaluation not); the bench's StepRunner {1000 * bench['ours']:.1f} ms/step and"
            f" a bare DeepSpeed loop {1000 * bench['bare']:.1f} ms/step ({bench['blocks']} alternating blocks of"
            f" {bench['steps']} steps, medians). Job / bench StepRunner throughput:"
            f" **{1000 * bench['ours'] / sa['ms_per_step']:.2f}**. {flops / 1e9:.1f} GFLOP a sample (forward+backward);"
            f" MFU job {100 * mfu['job']:.1f}%, StepRunner {100 * mfu['ours']:.1f}%, bare {100 * mfu['bare']:.1f}%"
            f" of {peak / 1e12:.0f} TFLOP/s.",
        ]
    lines += [
        "",
        f"Registered: version {found['version']} of `{found['model_name']}` as `@champion` ({found['register_s']:.1f} s)."
        f" Served as a server loads it (`mlflow.pyfunc.load_model('models:/{found['model_name']}@champion')`, CPU):"
        f" loaded in {served['load_s']:.1f} s, the first 1,000 holdout rows in {served['served_s']:.1f} s. Read back as"
        f" the next run's gate reads a champion (its transform and network program, on {served['device']}): all"
        f" {served['rows']:,} holdout rows in {served['device_s']:.1f} s, macro-F1 {served['macro_f1']:.4f}, where the"
        f" job's gate scored the candidate {a['result']['evaluation']['candidate']['macro_f1']:.4f} (and the job's"
        f" engine, in its compute dtype, {a['result']['holdout_metrics']['macro_f1']:.4f}); largest difference of a"
        f" class probability between the two on those 1,000 rows: {served['max_abs_difference']:.1e}.",
        f"The resumed run scored that champion beside itself: candidate {b['result']['evaluation']['candidate']['macro_f1']:.4f},"
        f" champion {(b['result']['evaluation']['champion'] or {}).get('macro_f1', float('nan')):.4f}.",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="CPU, a small encoder: checks the script")
    parser.add_argument("--rows", type=int, help="tickets in the day (default 40,000; tiny 3,000)")
    parser.add_argument("--batch", type=int, help="global batch (default 256; tiny 32)")
    parser.add_argument("--every", type=int, help="checkpoint every N steps (default 30; tiny 10)")
    parser.add_argument("--output", type=Path, help="also write the section to this file")
    args = parser.parse_args()
    rows, batch, every = (
        args.rows or (3_000 if args.tiny else 40_000),
        args.batch or (32 if args.tiny else 256),
        args.every or (10 if args.tiny else 30),
    )
    home = Path(tempfile.mkdtemp(prefix="gpu-job-"))
    os.environ["TRAINPIPE_HOME"] = str(home)
    from airflow_trainpipe.core.tracking_store import default_tracking_uri

    os.environ["MLFLOW_TRACKING_URI"] = (
        default_tracking_uri()
    )  # the jobs, the registry and the checks share it
    env = {**os.environ}
    import torch
    from pretrained_bench import make_encoder

    from airflow_trainpipe.examples.synthetic import write_day

    gpu = torch.cuda.is_available() and not args.tiny
    device = torch.cuda.get_device_name(0) if gpu else "cpu"
    files = write_day((home / "data/support_tickets").as_uri(), DAY, rows, seed=11, kind="support_tickets")
    started = time.monotonic()
    encoder = make_encoder(
        home / "encoders/support_tickets", files, ENCODER_TINY if args.tiny else ENCODER_100M
    )
    log("encoder", path=str(encoder), s=round(time.monotonic() - started, 1))
    config = home / "support_tickets_finetune.yaml"
    config.write_text(config_text(encoder, batch, every, gpu))
    shape = ENCODER_TINY if args.tiny else ENCODER_100M
    found: dict[str, Any] = {"device": device, "rows": rows, "batch": batch, "every": every, "shape": shape}
    found["straight"] = straight(config, env)
    log(
        "straight",
        **split(found["straight"]["result"]),
        metrics=found["straight"]["result"]["holdout_metrics"],
    )
    name = "support_tickets_finetune"
    found["model_name"] = name
    found["version"], found["register_s"] = register(found["straight"]["result"]["model_uri"], name)
    found["resumed"] = killed_then_resumed(config, env, every)
    resumed = found["resumed"]["result"]
    log("resumed", **split(resumed), resumed_from=resumed["resumed_from_step"], recomputed=resumed["steps_recomputed"],
        metrics=resumed["holdout_metrics"])  # fmt: skip
    found["served"] = served_holdout(config, name, torch.device("cuda", 0) if gpu else None)
    log("served", **found["served"])
    found["bench"] = bench_step(config, _snapshot_files(config), batch, args.tiny)
    log(
        "bench",
        **{k: v for k, v in found["bench"].items() if k != "failed"},
        failed="failed" in found["bench"],
    )
    found["parameters"] = found["bench"].get("parameters", float("nan"))
    found["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    found["versions"] = _versions()
    lines = section(found, "python benchmarks/gpu_job.py" + (" --tiny" if args.tiny else ""))
    print("\n".join(lines))
    if args.output:
        args.output.write_text("\n".join(lines) + "\n")


def _snapshot_files(config_path: Path) -> list[str]:
    from airflow_trainpipe.config import load_config
    from airflow_trainpipe.data.freeze import snapshot_for_date

    return snapshot_for_date(load_config(str(config_path)), f"{DAY}").file_uris


def _versions() -> str:
    from importlib.metadata import version

    names = ("torch", "deepspeed", "transformers", "mlflow-skinny", "mlflow")
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except Exception:
            continue
    return ", ".join(found)


if __name__ == "__main__":
    main()
