"""Regression, multiclass and ranking end to end (binary: test_pipeline.py and the demo): the
example configs as the factory builds them, through Airflow's own dag.test(), on synthetic days
from `trainpipe make-data`'s kinds.

Day 1 bootstraps each champion; day 2's candidate is scored against it on day 2's holdout, with
the bootstrap interval (by query for ranking), the per-slice checks and the gate's report. The
three pipelines run in one process (one Airflow start and DAG parse), one epoch each: what is
tested is the path through the tasks, not how well the models learn.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from datetime import date
from pathlib import Path

import pytest

from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import RESULT_MARK, dag_test_env
from tests.helpers.openlineage import facets_of, read_events, schema_errors, task_events, transport_env

# (pipeline, make-data kind, gate metric, sliced columns)
CASES = [
    ("house_prices", "house_sales", "rmse", {"building_type"}),
    # The text pipeline: a transformer encoder on the tickets' subject and body, sliced by length too.
    ("support_tickets", "support_tickets", "macro_f1", {"customer_tier", "body"}),
    ("search_ranking", "search_results", "ndcg_at_10", {"device"}),  # 2 ranks: queries gathered whole
]
TASKS = ["wait_for_data", "validate_data", "train", "gate", "register"]
DAG_FILE = f"""
import json
from datetime import datetime, timezone
from pathlib import Path

from airflow_trainpipe.factory import register_pipelines

register_pipelines(Path(__file__).parent / "configs", globals())

if __name__ == "__main__":
    for dag_id in {[case[0] for case in CASES]!r}:
        for day in ("2026-01-01", "2026-01-02"):
            run = globals()[dag_id].test(logical_date=datetime.fromisoformat(day).replace(tzinfo=timezone.utc))
            tasks = {{ti.task_id: str(ti.state) for ti in run.get_task_instances()}}
            print({RESULT_MARK!r} + json.dumps({{"dag": dag_id, "state": str(run.state), "tasks": tasks}}), flush=True)
"""


def _local(config: dict) -> None:
    """house_prices.yaml runs on Kubernetes GPUs over CSV weeks: here, a CPU rank over parquet
    days, with a bootstrap interval and a slice guardrail, as the other two examples have."""
    config["schedule"]["start_date"] = date(2026, 1, 1)  # weekly from 2026-01-05 in the example
    config["data"].update(uri="data/house_sales", partition="ds={{ ds }}", format="parquet")
    training = config["training"]
    for key in ("image", "kubernetes"):
        training.pop(key)
    training.update(launcher="local", resources={"gpus_per_node": 0, "processes_per_node": 1})
    training["deepspeed"] = {"zero_stage": 2}
    training["checkpoint"].update(uri="checkpoints")
    training["hyperparameters"].update(batch_size=128, learning_rate=0.003, warmup_steps=0)
    config["evaluation"] = {"slices": [{"column": "building_type"}]}
    config["gate"].update(
        confidence=0.95, slice_guardrail={"max_regression": 50_000, "min_rows": 100}
    )  # EUR of rmse


def _write_configs(configs: Path) -> None:
    import yaml

    configs.mkdir(exist_ok=True)
    for pipeline, _, _, _ in CASES:
        config = yaml.safe_load((EXAMPLE_CONFIGS / f"{pipeline}.yaml").read_text())
        config["training"]["hyperparameters"]["epochs"] = 1
        if pipeline == "house_prices":
            _local(config)
        elif pipeline == "support_tickets":
            config["training"]["resources"]["processes_per_node"] = 1
        (configs / f"{pipeline}.yaml").write_text(yaml.safe_dump(config))


def _xcoms(airflow_home: Path, dag_id: str, task_id: str) -> list[dict]:
    """The task's return values, one per run, oldest run first."""
    with sqlite3.connect(airflow_home / "airflow.db") as db:
        rows = db.execute(
            "select x.value from xcom x join dag_run r on x.dag_run_id = r.id "
            "where r.dag_id = ? and x.task_id = ? and x.key = 'return_value' order by r.logical_date",
            (dag_id, task_id),
        ).fetchall()
    return [json.loads(value) for (value,) in rows]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_each_task_type_trains_gates_and_registers_through_dag_test(
    tmp_path: Path, migrated_airflow_db: Path, migrated_mlflow_db: Path
) -> None:
    from mlflow import MlflowClient

    from airflow_trainpipe.examples.synthetic import write_day

    # An Airflow home and registry of its own: the session's (airflow_env) holds versions of these
    # pipelines' models that other tests registered (test_validate_text's support_tickets), and day 1
    # must find no champion. Its runs are a `python` process of their own, as a user's would be.
    airflow_env = dag_test_env(tmp_path, migrated_airflow_db, migrated_mlflow=migrated_mlflow_db)

    home = Path(airflow_env["TRAINPIPE_HOME"])
    for _, kind, _, _ in CASES:
        for day in (1, 2):
            write_day((home / "data" / kind).as_uri(), date(2026, 1, day), 3000, seed=day, kind=kind)
    dags = Path(airflow_env["AIRFLOW__CORE__DAGS_FOLDER"])
    _write_configs(dags / "configs")
    (dags / "task_types.py").write_text(DAG_FILE)
    events = home / "openlineage.jsonl"
    done = subprocess.run(
        [sys.executable, str(dags / "task_types.py")],
        env={**airflow_env, **transport_env(events)},
        capture_output=True,
        text=True,
        timeout=840,
    )
    output = done.stdout + done.stderr
    runs = [
        json.loads(line.split(RESULT_MARK, 1)[1]) for line in done.stdout.splitlines() if RESULT_MARK in line
    ]
    assert len(runs) == 2 * len(CASES), output[-6000:]

    airflow_home = Path(airflow_env["AIRFLOW_HOME"])
    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    for (pipeline, _, metric, column), first, second in zip(CASES, runs[::2], runs[1::2], strict=True):
        assert first["tasks"] == dict.fromkeys(TASKS, "success"), (pipeline, output[-6000:])
        assert second["state"] == "success" and second["tasks"]["gate"] == "success", (
            pipeline,
            output[-6000:],
        )
        trained = _xcoms(airflow_home, pipeline, "train")
        bootstrap, compared = _xcoms(airflow_home, pipeline, "gate")
        assert bootstrap["promote"] and bootstrap["champion_version"] is None
        # Day 2: both models on day 2's holdout, the interval and every slice of the column decided on.
        assert compared["metric"] == metric and compared["champion_version"] == "1"
        low, high = compared["improvement_interval"]
        assert low <= compared["improvement"] <= high
        assert compared["promote"] == (second["tasks"]["register"] == "success")
        assert {check["slice"].split("=")[0] for check in compared["slice_checks"]} == column
        evaluation = trained[1]["evaluation"]
        assert evaluation["holdout_rows"] > 0
        assert {s["slice"].split("=")[0] for s in evaluation["slices"]} == column
        assert all(s["champion"] is not None for s in evaluation["slices"])

        run = client.get_run(trained[1]["mlflow_run_id"])
        assert run.data.metrics[f"candidate_{metric}"] > 0 and run.data.metrics[f"champion_{metric}"] > 0
        assert "gate/report.html" in {a.path for a in client.list_artifacts(run.info.run_id, "gate")}
        champion = str(client.get_registered_model(pipeline).aliases["champion"])
        assert champion == ("2" if compared["promote"] else "1")
    _assert_lineage(read_events(events), airflow_home, home)


def _assert_lineage(events: list[dict], airflow_home: Path, home: Path) -> None:
    """The text pipeline's OpenLineage events: partition -> snapshot -> the run's model -> the
    registered version, each event valid against the spec."""
    assert {e["job"]["name"]: schema_errors(e) for e in events if schema_errors(e)} == {}
    dag = "support_tickets"
    for day, summary, trained, decision in zip(
        ("2026-01-01", "2026-01-02"),
        _xcoms(airflow_home, dag, "validate_data"),
        _xcoms(airflow_home, dag, "train"),
        _xcoms(airflow_home, dag, "gate"),
        strict=True,
    ):
        (validated,) = [
            e for e in task_events(events, dag, "validate_data", "COMPLETE") if day in e["inputs"][0]["name"]
        ]
        (partition,) = validated["inputs"]
        assert (partition["namespace"], partition["name"]) == ("file", str(home / "data" / dag / f"ds={day}"))
        assert {f["name"] for f in facets_of(partition)["schema"]["fields"]} >= {"subject", "body", "team"}
        assertions = facets_of(partition)["dataQualityAssertions"]["assertions"]
        assert assertions and all(a["success"] for a in assertions)
        (snapshot,) = validated["outputs"]
        assert facets_of(snapshot)["trainpipe_snapshot"]["digest"] == summary["manifest"]["digest"]
        (train,) = [
            e
            for e in task_events(events, dag, "train", "COMPLETE")
            if e["outputs"] and e["outputs"][0]["name"] == f"runs/{trained['mlflow_run_id']}/model"
        ]
        assert [(d["namespace"], d["name"]) for d in train["inputs"]] == [
            (snapshot["namespace"], snapshot["name"])
        ]
        (model,) = train["outputs"]
        assert model["facets"]["trainpipe_model"]["dataDigest"] == summary["manifest"]["digest"]
        (gate,) = [
            e for e in task_events(events, dag, "gate", "COMPLETE") if e["inputs"][0]["name"] == model["name"]
        ]
        assert gate["run"]["facets"]["trainpipe_gate"]["promote"] == decision["promote"]
    # Day 1's version: the run's model and the snapshot in, version 1 at the champion alias out.
    register = task_events(events, dag, "register", "COMPLETE")[0]
    (version,) = register["outputs"]
    assert version["name"] == f"models/{dag}/versions/1" and version["namespace"] == model["namespace"]
    assert (
        version["facets"]["trainpipe_model"]["alias"],
        version["facets"]["trainpipe_model"]["promoted"],
    ) == ("champion", True)
    assert len(register["inputs"]) == 2 and register["inputs"][1]["name"].endswith(".json")
