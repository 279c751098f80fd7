"""`make demo`: runs what exists of the pipeline on the embedded defaults, and says what it does not run.

Embedded defaults: local files under one output folder, MLflow in an SQLite file there, torchrun
with 2 CPU ranks. It never prints a result it did not compute.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import date
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("TRAINPIPE_DEMO_DIR", REPO / "var" / "demo")).resolve()
os.environ["TRAINPIPE_HOME"] = str(OUT)  # relative config paths and mlflow.db land here

from airflow_trainpipe.cli import main as trainpipe  # noqa: E402
from airflow_trainpipe.config import load_config  # noqa: E402
from airflow_trainpipe.train_spec import TrainSpec  # noqa: E402

CONFIG = REPO / "dags" / "configs" / "fraud_detector.yaml"

print(f"airflow-trainpipe demo: outputs go to {OUT}\n")
print("1. validate every pipeline config in dags/configs")
if trainpipe(["check", "-v", str(REPO / "dags" / "configs")]) != 0:
    sys.exit(1)

config = load_config(CONFIG)
DAYS = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
data_root = OUT / config.data.uri
print(f"\n2. generate 3 days of synthetic card transactions; day 3 has drifted amount and channel")
if trainpipe(["make-data", "--out", str(data_root), "--start", f"{DAYS[0]}", "--days", "3", "--rows", "20000", "--seed", "1",
              "--problem", f"{DAYS[2]}=drift:amount,channel"]) != 0:
    sys.exit(1)

print("\n3. snapshot and validate each day (schema, volume, Great Expectations, drift vs the previous day)")
from airflow_trainpipe.snapshot import resolve_snapshot  # noqa: E402
from airflow_trainpipe.validation import history  # noqa: E402
from airflow_trainpipe.validation.validate import history_payload, validate_snapshot, write_report  # noqa: E402

snapshots = {}
for day in DAYS:
    partition = f"ds={day}"
    manifest = resolve_snapshot(config.data, partition)
    previous = history.previous(config.data, config.pipeline, partition)
    report = validate_snapshot(config, partition, manifest, reference=previous, previous=previous)
    written = write_report(report)
    if report.passed:
        history.record(config.data, config.pipeline, partition, history_payload(report))
        snapshots[day] = manifest
    verdict = "passed" if report.passed else f"FAILED ({report.failure_summary()})"
    print(f"   {day}: {manifest.rows} rows, snapshot {manifest.digest[:19]}..., {len(report.checks)} checks {verdict}")
    if not report.passed:
        print("   " + report.failure_table().replace("\n", "\n   "))
    print(f"      report {written['report']}")
    if "data_docs" in written:
        print(f"      Data Docs {written['data_docs']}")

DAY = DAYS[0]
run_id = f"demo_{DAY:%Y%m%d}"
print(f"\n4. train fraud_detector on the {DAY} snapshot: torchrun, {config.training.resources.nproc_per_node} CPU ranks, "
      f"DeepSpeed ZeRO-{config.training.deepspeed.zero_stage}")
if trainpipe(["train", str(CONFIG), "--run-id", run_id, "--ds", f"{DAY}"]) != 0:
    sys.exit(1)

files = snapshots[DAY].file_uris
spec_dir = TrainSpec(config=config, run_id=run_id, data_files=files).run_dir.removeprefix("file://")
result = json.loads((Path(spec_dir) / "result.json").read_text())
print("\nresult (from result.json):")
print(f"   final step {result['final_step']}, train loss {result['final_train_loss']:.4f}, resumed from step {result['resumed_from_step']}")
print("   holdout " + ", ".join(f"{k}={v:.4f}" for k, v in result["holdout_metrics"].items()))
print(f"   weights sha256 {result['weights_sha256']}")
print(f"   MLflow run {result['mlflow_run_id']} in sqlite:///{OUT / 'mlflow.db'}")
print(f"   fitted feature transform {result['transform_hash']}")

import mlflow  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

mlflow.set_tracking_uri(f"sqlite:///{OUT / 'mlflow.db'}")
raw = pq.read_table(files[0].removeprefix("file://")).slice(0, 3).to_pandas()
predictions = mlflow.pyfunc.load_model(result["model_uri"]).predict(raw)
print(f"   the logged model on 3 raw rows of the snapshot: P(fraud) = {', '.join(f'{p:.4f}' for p in predictions)}")
print(f"   checkpoints and result.json in {spec_dir}")
print("   (run `make demo` again: the same run id resumes from its last checkpoint and finishes at once)")

print("\nBuilt, but run here only through their tests until the DAG factory (an open issue) wires them:")
for step in (
    "wait_for_data (DataSnapshotSensor), gate (BaselineGateOperator) and register (RegisterModelOperator)",
    "the fraud_detector DAG through dag.test() for 3 days: bootstrap, promote, drifted day stopped",
):
    print(f"  - {step}")
