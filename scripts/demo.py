"""`make demo`: the `fraud_detector` DAG through Airflow's own `dag.test()`, three synthetic days.

Embedded defaults only: Airflow on SQLite, local files, MLflow in an SQLite file, torchrun with
2 CPU ranks; everything goes to one folder (`var/demo`, or $TRAINPIPE_DEMO_DIR), emptied first so
day 1 really bootstraps. The DAG is the one the factory builds from `dags/configs/fraud_detector.yaml`,
loaded from this repository's dags folder as the DAG processor would.

- day 1: its export lacks the chargebacks of online fraud (labels arrive late): the data checks
  pass (nothing in the data looks wrong), the model becomes the first champion;
- day 2: complete labels: the candidate beats the champion on the same day-2 holdout: promoted;
- day 3: amount and channel drifted: stopped at validation, nothing trained or registered.

Every figure printed is read back from what the runs wrote (XComs, MLflow); none is computed here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("TRAINPIPE_DEMO_DIR", REPO / "var" / "demo")).resolve()
MARKER = OUT / ".trainpipe-demo"
BIN = Path(sys.executable).parent
DAYS = [date(2026, 1, 1), date(2026, 1, 2), date(2026, 1, 3)]
STORIES = {
    DAYS[0]: ("labels of online fraud arrive late", f"{DAYS[0]}=late_labels:channel:online"),
    DAYS[1]: ("complete labels", None),
    DAYS[2]: ("amount and channel drifted", f"{DAYS[2]}=drift:amount,channel"),
}
TASKS = ("wait_for_data", "validate_data", "train", "gate", "register")

# Runs in a fresh process per day: the DAG from the dags folder, one dag.test() run, and what
# the tasks returned, read back from Airflow's metadata DB.
RUN_DAY = """
import json, sys
from datetime import datetime, timezone
from airflow.dag_processing.dagbag import DagBag
from airflow.models.xcom import XComModel
from airflow.utils.session import create_session

bag = DagBag(sys.argv[1])
assert not bag.import_errors, bag.import_errors
dag = bag.get_dag("fraud_detector")
run = dag.test(logical_date=datetime.fromisoformat(sys.argv[2]).replace(hour=2, tzinfo=timezone.utc))
states = {ti.task_id: str(ti.state) for ti in run.get_task_instances()}
with create_session() as session:
    rows = session.scalars(XComModel.get_many(run_id=run.run_id, dag_ids=dag.dag_id, key="return_value")).all()
    values = {row.task_id: XComModel.deserialize_value(row) for row in rows}
print("DEMO-RESULT " + json.dumps({"run_id": run.run_id, "state": str(run.state), "tasks": states, "xcom": values}, default=str))
"""


def main() -> int:
    started = time.monotonic()
    _fresh_output_folder()
    env = {
        **os.environ,
        "TRAINPIPE_HOME": str(OUT),  # relative data/checkpoint URIs and the embedded mlflow.db land here
        "AIRFLOW_HOME": str(OUT / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_CONFIG_CACHE": str(OUT / "config-cache"),
    }
    env.pop("AIRFLOW_CONN_MLFLOW_DEFAULT", None)  # the embedded store, whatever the shell says
    lineage = OUT / "openlineage" / "events.jsonl"
    if importlib.util.find_spec("airflow.providers.openlineage") is not None:  # the [openlineage] extra
        lineage.parent.mkdir()
        env.update(
            AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
                {"type": "file", "log_file_path": str(lineage), "append": True}
            ),
            AIRFLOW__OPENLINEAGE__NAMESPACE="trainpipe-demo",
            AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD="True",
        )
    print(f"airflow-trainpipe demo: every output goes to {OUT}\n")

    print("1. validate every pipeline config in dags/configs")
    _run([str(BIN / "trainpipe"), "check", "-v", str(REPO / "dags" / "configs")], env)

    data = OUT / "data" / "card_transactions"
    print("\n2. generate 3 days of synthetic card transactions (20,000 rows a day)")
    problems = [arg for _, problem in STORIES.values() if problem for arg in ("--problem", problem)]
    _run(
        [
            str(BIN / "trainpipe"),
            "make-data",
            "--out",
            str(data),
            "--start",
            f"{DAYS[0]}",
            "--days",
            "3",
            "--rows",
            "20000",
            "--seed",
            "1",
            *problems,
        ],
        env,
    )
    for day, (story, _) in STORIES.items():
        print(f"   {day}: {story}")

    print("\n3. migrate Airflow's metadata DB (SQLite)")
    logs = OUT / "logs"
    logs.mkdir()
    _run([str(BIN / "airflow"), "db", "migrate"], env, log=logs / "airflow-db-migrate.log")

    print("\n4. run the fraud_detector DAG once per day with dag.test(): " + " -> ".join(TASKS))
    results = {}
    for number, day in enumerate(DAYS, 1):
        log = logs / f"day{number}-{day}.log"
        print(f"\n   day {number} ({day}, {STORIES[day][0]}): running ... (task logs: {log})", flush=True)
        t0 = time.monotonic()
        output = _run([str(BIN / "python"), "-c", RUN_DAY, str(REPO / "dags"), f"{day}"], env, log=log)
        results[day] = json.loads(output.split("DEMO-RESULT ", 1)[1].splitlines()[0])
        _print_day(results[day], time.monotonic() - t0)

    print("\n5. the registry afterwards (read with the MLflow client)")
    _print_registry()
    if lineage.exists():
        print(f"\n6. the lineage a backend draws from the tasks' OpenLineage events ({lineage})")
        _print_lineage(lineage)
    print("\nWhere to look:")
    print(
        f"   MLflow:      sqlite:///{OUT / 'mlflow.db'}   (mlflow ui --backend-store-uri sqlite:///{OUT / 'mlflow.db'})"
    )
    for docs in sorted(data.glob("ds=*/_trainpipe/fraud_detector/*/data_docs.html")):
        print(f"   Data Docs:   {docs}")
    for day, result in results.items():
        if report := _gate_report(result):
            print(
                f"   Gate report: {report}   (day {DAYS.index(day) + 1}: the gate's HTML report, in MLflow's artifacts)"
            )
    print(f"   task logs:   {logs}")
    print(
        f"   Airflow:     AIRFLOW_HOME={OUT / 'airflow'} (SQLite), DAG file {REPO / 'dags' / 'trainpipe_pipelines.py'}"
    )
    print(
        f"\nReproduce the champion bit for bit: TRAINPIPE_HOME={OUT} {BIN / 'trainpipe'} reproduce fraud_detector@champion"
    )
    print(f"\ndemo finished in {time.monotonic() - started:.0f} s")
    return 0


def _print_lineage(path: Path) -> None:
    """Each task's inputs -> outputs, in the order the events were written."""
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    shown = 0
    for event in events:
        if event["eventType"] not in ("COMPLETE", "FAIL") or not (
            event.get("inputs") or event.get("outputs")
        ):
            continue
        task = event["job"]["name"].split(".", 1)[1]
        inputs = ", ".join(_dataset_label(d) for d in event.get("inputs", []))
        outputs = ", ".join(_dataset_label(d) for d in event.get("outputs", []))
        failed = [
            a["assertion"]
            for d in event.get("inputs", [])
            for a in d.get("inputFacets", {}).get("dataQualityAssertions", {}).get("assertions", [])
            if not a["success"]
        ]
        note = f"   FAILED: {', '.join(failed)}" if event["eventType"] == "FAIL" else ""
        print(f"   {task:<14} {inputs or '-'}  ->  {outputs or '-'}{note}")
        shown += 1
    print(f"   ({len(events)} events, {shown} with datasets; docs/lineage.md says what each task reports)")


def _dataset_label(dataset: dict[str, Any]) -> str:
    name = dataset["name"]
    if "/_trainpipe/snapshots/" in name:
        return f"snapshot {name.rsplit('/', 1)[1][:12]}"
    if name.startswith("runs/"):
        return f"model of run {name.split('/')[1][:8]}"
    if name.startswith("models/"):
        model = dataset.get("facets", {}).get("trainpipe_model", {})
        alias = f" @{model['alias']}" if model.get("alias") else ""
        return f"{name.split('/')[1]} v{name.rsplit('/', 1)[1]}{alias}"
    return name.removeprefix(str(OUT) + "/")


def _fresh_output_folder() -> None:
    # Only a folder this script made (it carries the marker) or an empty one is ever emptied.
    if OUT.exists() and any(OUT.iterdir()) and not MARKER.exists():
        sys.exit(
            f"{OUT} is not empty and was not made by `make demo`; set TRAINPIPE_DEMO_DIR to another folder"
        )
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    MARKER.write_text("made by `make demo`; emptied at the start of every run\n")


def _run(command: list[str], env: dict[str, str], log: Path | None = None) -> str:
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log is not None:
        log.write_text(done.stdout)
    else:
        print("   " + done.stdout.rstrip().replace("\n", "\n   "))
    if done.returncode != 0:
        tail = "\n".join(done.stdout.splitlines()[-40:])
        sys.exit(f"`{' '.join(command[:3])} ...` failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _print_day(result: dict, seconds: float) -> None:
    tasks, xcom = result["tasks"], result["xcom"]
    print(f"   DAG run {result['run_id']}: {result['state']} in {seconds:.0f} s")
    print("   " + " | ".join(f"{task} {tasks.get(task, '-')}" for task in TASKS))
    validated = xcom.get("validate_data")
    if validated and validated["passed"]:
        print(f"   data: snapshot {validated['digest'][:19]}..., {validated['rows']} rows, all checks passed")
    elif validated:  # validation.fail_on: never: the run went on, the report still failed checks
        print(
            f"   data: snapshot {validated['digest'][:19]}..., {validated['rows']} rows, "
            f"{len(validated['failures'])} check(s) FAILED (validation.fail_on is never: training went on):"
        )
        for check in validated["failures"]:
            print(f"      {check['kind']} {check['name']}: {check['message']} (expected {check['expected']})")
    else:
        report = _failed_report()
        if report is not None:
            failed = [check for check in report["checks"] if not check["passed"]]
            print(
                f"   data: FAILED validation, nothing trained or registered ({len(failed)} of {len(report['checks'])} checks):"
            )
            for check in failed:
                print(
                    f"      {check['kind']} {check['name']}: {check['message']} (expected {check['expected']})"
                )
    train = xcom.get("train")
    if train:
        evaluation = train.get("evaluation") or {}
        candidate, champion = evaluation.get("candidate") or {}, evaluation.get("champion")
        print(
            f"   train: MLflow run {train['mlflow_run_id']}, candidate on this day's holdout: "
            + ", ".join(
                f"{k} {v:.4f}"
                for k, v in sorted(candidate.items())
                if k in ("roc_auc", "log_loss", "recall", "threshold")
            )
        )
        if champion:
            print(
                f"          champion version {evaluation.get('champion_version')} on the same rows: "
                + ", ".join(
                    f"{k} {v:.4f}"
                    for k, v in sorted(champion.items())
                    if k in ("roc_auc", "log_loss", "recall", "threshold")
                )
            )
    gate = xcom.get("gate")
    if gate:
        print(f"   gate: {'PROMOTE' if gate['promote'] else 'keep the champion'}: {gate['reason']}")
    register = xcom.get("register")
    if register:
        moved = (
            f" (version {register['previous_version']} is now @{register['previous_alias']})"
            if register.get("previous_version")
            else ""
        )
        print(
            f"   registry: {register['model_name']} version {register['version']} is @{register['alias']}{moved}"
        )
    elif tasks.get("register") == "skipped":
        print("   registry: unchanged (register skipped)")


def _failed_report() -> dict | None:
    reports = sorted(
        (OUT / "data" / "card_transactions").glob("ds=*/_trainpipe/fraud_detector/*/report.json"),
        key=lambda p: p.stat().st_mtime,
    )
    return json.loads(reports[-1].read_text()) if reports else None


def _gate_report(result: dict) -> str | None:
    """The file of the gate's HTML report on the day's candidate run (the embedded store's
    artifacts are local files), or None when the run did not reach the gate."""
    import mlflow

    train = result["xcom"].get("train")
    if not train or "gate" not in result["xcom"]:
        return None
    client = mlflow.MlflowClient(f"sqlite:///{OUT / 'mlflow.db'}")
    root = client.get_run(train["mlflow_run_id"]).info.artifact_uri
    path = Path(root.removeprefix("file://")) / "gate" / "report.html"
    return str(path) if path.exists() else None


def _print_registry() -> None:
    import mlflow  # the demo's own process: the DAG runs are over, nothing here is parse time

    client = mlflow.MlflowClient(f"sqlite:///{OUT / 'mlflow.db'}")
    # search_model_versions leaves aliases out; get_model_version has them.
    found = client.search_model_versions("name = 'fraud_detector'")
    for version in sorted(
        (client.get_model_version(v.name, v.version) for v in found), key=lambda v: int(v.version)
    ):
        tags = version.tags
        print(
            f"   fraud_detector v{version.version} {', '.join('@' + a for a in version.aliases) or '(no alias)'}: "
            f"DAG run {tags.get('airflow.dag_run_id')}, data {str(tags.get('trainpipe.data_digest'))[:19]}..., "
            f"{_gate_comparison(tags)}"
        )


def _gate_comparison(tags: dict[str, str]) -> str:
    """The gate's own comparison: the candidate and the champion scored on one holdout, its run's.
    Two versions' candidate scores are on different days' rows: printed one under the other,
    a later champion could look worse than the version it beat."""
    from airflow_trainpipe.contracts import tags as names

    scored = (
        f"at its gate {tags.get(names.GATE_METRIC_TAG, 'score')} {float(tags[names.GATE_CANDIDATE_TAG]):.4f}"
    )
    compared = tags.get(names.CHAMPION_COMPARED_TAG, "none")
    if compared == "none":
        return f"{scored} on its run's holdout, with no champion to compare"
    champion, against = tags.get(names.GATE_CHAMPION_TAG, "None"), f"v{compared.rsplit('/', 1)[-1]}"
    if champion == "None":  # the champion could not be scored, and the gate was forced
        return f"{scored} on its run's holdout; {against} could not be scored"
    return f"{scored} against {against}'s {float(champion):.4f} on the same rows (its run's holdout)"


if __name__ == "__main__":
    sys.exit(main())
