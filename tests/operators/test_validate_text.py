"""validate_data on a text pipeline in dag.test(): clean tickets pass; blank text, a vocabulary the
champion's tokenizer cannot read and a champion whose tokenizer is unreadable each stop the run
before training, at once (no retry), naming the column and the cause, and each failure is an
OpenLineage FAIL event carrying the failed checks as assertions."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pyarrow as pa
import pytest

from airflow_trainpipe.config.text import TextTransform
from airflow_trainpipe.examples.synthetic import Problem, write_day
from airflow_trainpipe.runtime.data.text import TextFitter
from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.airflow_dags import run_dag_file_for_dates
from tests.helpers.openlineage import facets_of, read_events, schema_errors, task_events, transport_env
from tests.operators.test_validate import DAG_SOURCE

pytestmark = pytest.mark.slow

DAYS = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"]
FRENCH = [
    "bonjour je n'arrive pas à me connecter à mon compte",
    "la facture comporte des frais que je n'ai jamais acceptés",
    "le colis est arrivé abîmé et il manque un article",
    "l'application plante à chaque ouverture des réglages",
] * 50


def _champion(home: Path, transform: dict) -> str:
    """A registered version of support_tickets at alias champion, whose run logged `transform`."""
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("champions") or client.get_experiment(
        client.create_experiment("champions", artifact_location=(home / "mlartifacts" / "champions").as_uri())
    )
    run = client.create_run(experiment.experiment_id)
    client.log_dict(run.info.run_id, transform, "transform.json")
    client.set_terminated(run.info.run_id)
    if not client.search_registered_models("name = 'support_tickets'"):
        client.create_registered_model("support_tickets")
    version = client.create_model_version(
        "support_tickets", f"{run.info.artifact_uri}/model", run.info.run_id
    )
    client.set_registered_model_alias("support_tickets", "champion", version.version)
    return str(version.version)


def _french_transform() -> dict:
    transform = TextTransform(vocab_size=120, min_frequency=1, max_length=96)
    rows = pa.table({"subject": FRENCH, "body": FRENCH})
    text = TextFitter("subject", ["subject", "body"], transform).fit(lambda: [rows])
    return {"format": "trainpipe.transform/1", "columns": [], "label": {}, "text": [text]}


def test_bad_text_stops_before_training_and_names_the_column_and_the_cause(
    airflow_env: dict[str, str], tmp_path: Path
) -> None:
    data, home = tmp_path / "data", Path(airflow_env["TRAINPIPE_HOME"])
    for day in DAYS[:3]:
        write_day(data.as_uri(), date.fromisoformat(day), 2000, seed=1, kind="support_tickets")
    write_day(data.as_uri(), date(2026, 1, 4), 2000, seed=1, kind="support_tickets",
              problems=[Problem.parse("nulls:body:0.4")])  # fmt: skip
    config = tmp_path / "support_tickets.yaml"
    config.write_text(
        (EXAMPLE_CONFIGS / "support_tickets.yaml")
        .read_text()
        .replace("uri: data/support_tickets", f"uri: {data.as_uri()}")
    )
    versions: list[str] = []

    def before_run(day: str) -> None:
        if day == "2026-01-02":  # a champion whose tokenizer learnt French: English is unknown to it
            versions.append(_champion(home, _french_transform()))
        elif day == "2026-01-03":  # a champion whose tokenizer cannot be read
            broken = _french_transform()
            broken["text"][0]["tokenizer"] = '{"version": "1.0", "model": "garbage"'
            versions.append(_champion(home, broken))
        elif day == "2026-01-04":  # its tokenizer readable again: only the blank text fails
            versions.append(_champion(home, _tickets_transform(data)))

    source = DAG_SOURCE.format(dag_id="validate_text", config=str(config), callbacks="")
    events = tmp_path / "openlineage.jsonl"
    clean, unknown, unreadable, blank = run_dag_file_for_dates(
        {**airflow_env, **transport_env(events)}, "validate_text", source, DAYS, before_run=before_run
    )
    assert (clean.state, clean.tasks) == ("success", {"validate_data": "success", "train": "success"}), (
        clean.output[-5000:]
    )
    for run in (unknown, unreadable, blank):
        assert run.tasks == {"validate_data": "failed", "train": "upstream_failed"}, run.output[-5000:]
        assert run.tries["validate_data"] == 1 and "TRAINS-ON" not in run.output
    failed = {day: _failed_checks(data, day) for day in DAYS[1:]}
    (check,) = failed["2026-01-02"]
    assert (check["kind"], check["name"], check["column"]) == ("text", "unknown_tokens", "subject")
    assert check["observed"] > 0.05 and f"champion version {versions[0]}'s tokenizer" in check["message"]
    (check,) = failed["2026-01-03"]
    assert check["observed"] == "unreadable"
    assert f"the tokenizer of champion version {versions[1]} cannot be read" in check["message"]
    # Blank rows, and the length profile they shift (words per text, scored like a numeric column).
    blank_check, drift = failed["2026-01-04"]
    assert (blank_check["name"], blank_check["column"]) == ("blank_fraction", "body")
    assert blank_check["observed"] > 0.35 and "hold no text (null or blank)" in blank_check["message"]
    assert (drift["kind"], drift["name"], drift["column"]) == ("drift", "psi", "body")
    assert "failed validation (text: body; drift: body)" in blank.output
    _assert_fail_events(read_events(events), data)


def _assert_fail_events(events: list[dict], data: Path) -> None:
    """One COMPLETE (the clean day), then one FAIL per failed day, each valid against the spec,
    reading the day's partition and carrying its failed checks."""
    assert [e for e in events if schema_errors(e)] == []
    (complete,) = task_events(events, "validate_text", "validate_data", "COMPLETE")
    assert all(a["success"] for a in facets_of(complete["inputs"][0])["dataQualityAssertions"]["assertions"])
    fails = task_events(events, "validate_text", "validate_data", "FAIL")
    assert [e["inputs"][0]["name"] for e in fails] == [str(data / f"ds={day}") for day in DAYS[1:]]
    failed = [
        {
            (a["assertion"], a.get("column"))
            for a in facets_of(e["inputs"][0])["dataQualityAssertions"]["assertions"]
            if not a["success"]
        }
        for e in fails
    ]
    assert failed == [
        {("unknown_tokens", "subject")},
        {("unknown_tokens", "subject")},
        {("blank_fraction", "body"), ("psi", "body")},
    ]
    assert "failed validation" in fails[-1]["run"]["facets"]["errorMessage"]["message"]


def _tickets_transform(data: Path) -> dict:
    import pyarrow.parquet as pq

    rows = pq.read_table(next((data / "ds=2026-01-01").glob("*.parquet")), columns=["subject", "body"])
    text = TextFitter("subject", ["subject", "body"], TextTransform(vocab_size=800, max_length=96)).fit(
        lambda: [rows]
    )
    return {"format": "trainpipe.transform/1", "columns": [], "label": {}, "text": [text]}


def _failed_checks(data: Path, day: str) -> list[dict]:
    report = json.loads(
        next((data / f"ds={day}" / "_trainpipe" / "support_tickets").glob("*/report.json")).read_text()
    )
    assert report["passed"] is False
    return [c for c in report["checks"] if not c["passed"]]
