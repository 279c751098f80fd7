"""The end of a training job (issue 53): ours vs a bare equivalent, side by side in one run.

Ours: the end phase of `trainpipe train` (result.json `timing.end_s` and its phases) of the
pretrained fine-tune pipeline (support_tickets_finetune.yaml on a small encoder directory, one
CPU rank): the final metrics, the weights, the candidate scored on the holdout's raw rows, the
champion scored on the same rows (the second job; the first has none), the comparison, the
export, the logged MLflow model with its Hugging Face directory, the result.
Bare: what a hand-written script does at the end of a fine-tune, in its own process on the same
rows and threads: one forward pass over the holdout (the directory's tokenizer, batches padded to
their longest row, fp32, no_grad), `save_pretrained`, and the directory's files logged to MLflow.

`python benchmarks/end_bench.py` prints the section; `make bench ONLY=end` writes it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
DAY = date(2026, 1, 1)
ROWS, STEPS = 20_000, 10
ENCODER = {"hidden_size": 128, "layers": 2, "heads": 2, "intermediate_size": 512}


def _config(encoder: Path) -> str:
    config = yaml.safe_load((REPO / "dags/configs/support_tickets_finetune.yaml").read_text())
    training = config["training"]
    training["pretrained"] = encoder.as_uri()
    training["hyperparameters"].update(epochs=1, batch_size=64)
    training["deepspeed"] = {"zero_stage": 1}
    training["resources"] = {"gpus_per_node": 0, "processes_per_node": 1}
    return yaml.safe_dump(config, sort_keys=False)


def _job(config: Path, run_id: str, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "airflow_trainpipe.cli", "train", str(config), "--run-id", run_id]
    command += ["--ds", f"{DAY}", "--max-steps", str(STEPS)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{run_id} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    line = next(x for x in done.stderr.splitlines() if x.startswith("run directory "))
    run_dir = Path(line.removeprefix("run directory ").split(";")[0].removeprefix("file://"))
    return json.loads((run_dir / "result.json").read_text())


_BARE = r"""
import json, sys, tempfile, time
from pathlib import Path
import mlflow, numpy as np, torch
from tokenizers import Tokenizer
from transformers import AutoModel
from airflow_trainpipe.config import load_config
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.runtime.data.reader import HoldoutSplit, read_table

config_path, encoder, day, classes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
data = load_config(config_path).data
files = snapshot_for_date(load_config(config_path), day).file_uris
table = read_table(files, data.format, ["subject", "body", data.holdout.key_column])
holdout = table.filter(np.asarray(HoldoutSplit(data).mask(table)))
model = AutoModel.from_pretrained(encoder, local_files_only=True).eval()
head = torch.nn.Linear(model.config.hidden_size, classes)
tokenizer = Tokenizer.from_file(f"{encoder}/tokenizer.json")
tokenizer.enable_truncation(96)
started = time.perf_counter()
pairs = list(zip(holdout.column("subject").to_pylist(), holdout.column("body").to_pylist()))
outputs = []
with torch.no_grad():
    for start in range(0, len(pairs), 4096):
        encoded = tokenizer.encode_batch_fast(pairs[start : start + 4096])
        width = max(len(e.ids) for e in encoded)
        ids = torch.zeros(len(encoded), width, dtype=torch.long)
        mask = torch.zeros(len(encoded), width, dtype=torch.long)
        for i, e in enumerate(encoded):
            ids[i, : len(e.ids)] = torch.tensor(e.ids)
            mask[i, : len(e.ids)] = 1
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
        outputs.append(torch.softmax(head(hidden), -1))
forward = time.perf_counter() - started
with tempfile.TemporaryDirectory() as folder:
    started = time.perf_counter()
    model.save_pretrained(folder)
    saved = time.perf_counter() - started
    started = time.perf_counter()
    with mlflow.start_run():
        mlflow.log_artifacts(folder, "hf")
    logged = time.perf_counter() - started
print("BARE " + json.dumps({"rows": len(pairs), "forward_s": forward, "save_s": saved, "log_s": logged}))
"""


def _bare(config: Path, encoder: Path, classes: int, env: dict[str, str]) -> dict[str, Any]:
    command = [sys.executable, "-c", _BARE, str(config), str(encoder), f"{DAY}", str(classes)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    found = json.loads(done.stdout.split("BARE ", 1)[1].splitlines()[0])
    return {**found, "total_s": found["forward_s"] + found["save_s"] + found["log_s"]}


def measure() -> dict[str, Any]:
    from pretrained_bench import make_encoder

    from airflow_trainpipe.examples.synthetic import write_day

    home = Path(tempfile.mkdtemp(prefix="end-bench-"))
    env = {
        **os.environ,
        "TRAINPIPE_HOME": str(home),
        "MLFLOW_TRACKING_URI": f"sqlite:///{home / 'mlflow.db'}",
    }
    # One rank, as the job's one rank gets the host's cores (launchers/local.py).
    env.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
    files = write_day((home / "data/support_tickets").as_uri(), DAY, ROWS, seed=11, kind="support_tickets")
    encoder = make_encoder(home / "encoders/support_tickets", files, ENCODER)
    config = home / "support_tickets_finetune.yaml"
    config.write_text(_config(encoder))
    bare = [_bare(config, encoder, 4, env)]
    first = _job(config, "first", env)  # no champion yet: the gate's bootstrap
    _register(first["model_uri"], env)
    bare.append(_bare(config, encoder, 4, env))
    second = _job(config, "second", env)  # scores the first as its champion
    bare.append(_bare(config, encoder, 4, env))
    return {"first": first, "second": second, "bare": bare}


def _register(model_uri: str, env: dict[str, str]) -> None:
    code = (
        "import mlflow, sys\n"
        "v = mlflow.register_model(sys.argv[1], 'support_tickets_finetune').version\n"
        "mlflow.MlflowClient().set_registered_model_alias('support_tickets_finetune', 'champion', v)\n"
    )
    subprocess.run([sys.executable, "-c", code, model_uri], env=env, check=True, capture_output=True)


def bench_end() -> list[str]:
    found = measure()
    bare = {
        k: statistics.median(b[k] for b in found["bare"]) for k in ("forward_s", "save_s", "log_s", "total_s")
    }
    lines = [
        "## End of a training job: ours vs bare (issue 53)",
        "",
        "Command: `make bench ONLY=end` (`python benchmarks/end_bench.py`). The pretrained fine-tune pipeline",
        f"(support_tickets_finetune.yaml) on a small encoder directory (hidden {ENCODER['hidden_size']}, "
        f"{ENCODER['layers']} layers, FFN {ENCODER['intermediate_size']}), one CPU rank, {STEPS} steps of batch 64;",
        f"{ROWS:,} tickets, {found['bare'][0]['rows']:,} of them in the holdout. Ours: the job's end (result.json"
        " `timing.end_s`). Bare, in",
        "a process of its own on the same rows and threads: one forward pass over the holdout (the directory's",
        "tokenizer, batches of 4,096 padded to their longest row, fp32), `save_pretrained`, `mlflow.log_artifacts`",
        f"(medians of {len(found['bare'])}, measured before, between and after the jobs).",
        "",
        "| job | ours: end s | bare: forward + save + log s | ours / bare |",
        "|---|---|---|---|",
    ]
    for name, result in (
        ("first (no champion: bootstrap)", found["first"]),
        ("second (scores the champion)", found["second"]),
    ):
        end = result["timing"]["end_s"]
        lines.append(f"| {name} | {end:.2f} | {bare['total_s']:.2f} | **{end / bare['total_s']:.2f}** |")
    lines += [
        "",
        f"Bare, split: forward {bare['forward_s']:.2f} s, save_pretrained {bare['save_s']:.2f} s, log {bare['log_s']:.2f} s.",
        "The second job also scores the champion on the same rows (the gate's comparison: a second forward",
        "pass, the champion's transform and program): the bare script has no champion to score.",
    ]
    for name, result in (("first", found["first"]), ("second", found["second"])):
        phases = ", ".join(f"{k} {v:.2f}" for k, v in result["timing"]["end"].items())
        lines.append(f"Ours, {name} job's end by phase (s): {phases}.")
    return [*lines, ""]


if __name__ == "__main__":
    sys.path.insert(0, str(REPO / "benchmarks"))
    print("\n".join(bench_end()))
