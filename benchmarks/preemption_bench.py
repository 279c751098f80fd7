"""The emergency save of issue 19: SIGTERM to a training job of a ~100M-parameter model on CPU.

The real job (torchrun, 2 gloo ranks, ZeRO-1, the job's DeepSpeed config) trains a wide
`tabular_mlp` with no periodic checkpoint due; once it reports step 10, torchrun gets SIGTERM as a
pod's PID 1 would on a spot reclaim. The figure is the job's own `preempted` event: seconds from
the signal reaching rank 0 to the checkpoint's completion marker (every rank's step finished,
DeepSpeed's files written, hashed, the marker written), for each `training.checkpoint.compression`.
Then the job is run again and must resume from that step with 0 steps recomputed.

`python benchmarks/preemption_bench.py` prints the table; `make bench ONLY=preemption` writes it.
"""

from __future__ import annotations

import signal
import tempfile
from datetime import date
from pathlib import Path

from airflow_trainpipe.config import parse_config
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.examples.synthetic import write_day
from airflow_trainpipe.launchers.local import LocalLauncher

REPO = Path(__file__).resolve().parents[1]
ROWS, NPROC, HIDDEN, BATCH = 20_000, 2, "[8192, 8192, 4096]", 32
TARGET_S = 10.0


def _spec(tmp: Path, files: list[str], compression: str) -> TrainSpec:
    text = (REPO / "dags/configs/fraud_detector.yaml").read_text()
    for old, new in (
        ("hidden_sizes: [64, 32]", f"hidden_sizes: {HIDDEN}"),
        ("batch_size: 256", f"batch_size: {BATCH}"),
        ("uri: checkpoints", f"uri: {(tmp / compression).as_uri()}"),
        (
            "every_steps: 100",
            "every_steps: 100000" + (f"\n    compression: {compression}" if compression != "none" else ""),
        ),
    ):
        assert old in text, old
        text = text.replace(old, new)
    return TrainSpec(config=parse_config(text), run_id="preempted", data_files=files)


def _run(spec: TrainSpec, sigterm_on: str, after_step: int = 0) -> dict:
    """Start the job; SIGTERM torchrun at its first `sigterm_on` event (a progress event: at or
    after `after_step`); return that event, or the `preempted` one when it was a progress event."""
    launcher = LocalLauncher(spec, NPROC)
    launcher.start()
    seen: dict[str, dict] = {}
    tail: list[str] = []
    for line in launcher.lines():
        tail = [*tail[-40:], line.text]
        event = line.event or {}
        kind = event.get("event")
        if kind == sigterm_on and sigterm_on not in seen and event.get("step", after_step) >= after_step:
            seen[kind] = event
            launcher.process.send_signal(signal.SIGTERM)
        elif kind == "preempted":
            seen[kind] = event
    launcher.wait()
    wanted = "preempted" if sigterm_on == "progress" else sigterm_on
    if wanted not in seen:
        raise RuntimeError("the job did not report what the bench needs:\n" + "\n".join(tail))
    return seen[wanted]


def _bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


def _parameters(checkpoints: Path) -> int:
    import torch

    states = next(checkpoints.rglob("mp_rank_00_model_states.pt"))
    module = torch.load(states, map_location="cpu", weights_only=True)["module"]
    return sum(t.numel() for t in module.values())


def bench_preemption(compressions: tuple[str, ...] = ("none", "zstd")) -> list[str]:
    lines = [
        "## Preemption: the emergency save of a ~100M-parameter model on CPU (issue 19)",
        "",
        f"`tabular_mlp` {HIDDEN} (~{{params}}M parameters with this data's inputs), {NPROC} CPU ranks (gloo),",
        f"ZeRO-1, fp32, batch {BATCH} per rank; no periodic checkpoint due. SIGTERM to torchrun once the job",
        "reports step 10; the figure is the job's `preempted` event: seconds from the signal to the",
        "checkpoint's completion marker (the ranks' step finished, DeepSpeed's files written and hashed,",
        "the marker written) on local disk. The job is then started again and must resume from that step",
        "with 0 steps recomputed. Command: `make bench ONLY=preemption`.",
        "",
        "| compression | stopped after step | signal -> step finished | signal -> complete checkpoint | checkpoint on disk | resumed from | steps recomputed |",
        "|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        files = write_day((tmp / "data").as_uri(), date(2026, 1, 1), ROWS, seed=11)
        for compression in compressions:
            spec = _spec(tmp, files, compression)
            preempted = _run(spec, "progress", after_step=10)
            on_disk = _bytes(tmp / compression)
            if compression == "none":
                lines[2] = lines[2].replace("{params}", f"{_parameters(tmp / compression) / 1e6:.0f}")
            resumed = _run(spec, "start")  # stopped again as soon as it says where it resumed
            lines.append(
                f"| {compression} | {preempted['step']} | {preempted['signal_to_stopped_s']:.2f} s "
                f"| **{preempted['signal_to_saved_s']:.2f} s** "
                f"| {on_disk / 2**20:,.0f} MiB | {resumed['resumed_from']} | {resumed['steps_recomputed']} |"
            )
    lines += ["", f"Target: < {TARGET_S:.0f} s to local disk; 0 steps recomputed.", ""]
    return lines


if __name__ == "__main__":
    print("\n".join(bench_preemption()))
