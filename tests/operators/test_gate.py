"""BaselineGateOperator against real MLflow runs (real server with basic auth, and embedded sqlite).

The rule matrix itself is tested in tests/test_promotion.py; here: reading both metric sets from
the candidate run, the report artifacts, and every invalid state failing with a clear message.
The skip of downstream tasks runs through dag.test() in test_pipeline.py.
"""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.operators.gate import BaselineGateOperator, as_bool
from tests.helpers.mlflow_backends import BACKENDS, define_connection, gate_decision, write_config
from tests.helpers.mlflow_server import log_candidate_run

CHAMPION = {"roc_auc": 0.80, "log_loss": 0.30, "recall": 0.50, "accuracy": 0.9}


def test_template_fields_are_public_api() -> None:
    assert BaselineGateOperator.template_fields == ("mlflow_run_id", "force")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), ("True", True), ("false", False), ("", False), (0, False), ("1", True)],
)
def test_force_flag_accepts_rendered_booleans(value: object, expected: bool) -> None:
    assert as_bool(value, "force") is expected


def test_force_flag_rejects_anything_else() -> None:
    with pytest.raises(AirflowFailException, match="force must be true or false, got 'maybe'"):
        as_bool("maybe", "force")


@pytest.fixture(params=BACKENDS)
def gate_setup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    define_connection(monkeypatch, request.param, request, tmp_path)
    model_name = f"gate_{uuid.uuid4().hex[:8]}"
    config = write_config(tmp_path / "pipeline.yaml", model_name)
    hook = MlflowHook()

    def candidate(
        metrics: dict[str, float], champion: dict[str, float] | None, version: str | None, **tags: str
    ) -> str:
        with hook.activated():
            return log_candidate_run(model_name, metrics, champion, version, model_name=model_name, tags=tags)

    return hook, config, model_name, candidate


def test_bootstrap_decision_and_report_on_the_run(gate_setup) -> None:
    hook, config, model_name, candidate = gate_setup
    run_id = candidate(CHAMPION, None, None)
    report = BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id=run_id).execute({})
    assert report["promote"] is True and report["champion"] is None and report["champion_version"] is None
    assert report["reason"] == "no champion yet: roc_auc = 0.8 reaches no_champion.min_value (>= 0.5)"
    assert report["mlflow_run_id"] == run_id and report["model_name"] == model_name
    with hook.activated():
        client = hook.get_conn()
        artifacts = {a.path for a in client.list_artifacts(run_id, "gate")}
        assert artifacts == {"gate/decision.json", "gate/comparison.png"}
        local = client.download_artifacts(run_id, "gate")
        assert json.loads((Path(local) / "decision.json").read_text()) == report
        assert (Path(local) / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert client.get_run(run_id).data.tags["trainpipe.gate.promote"] == "true"


def test_missing_run_fails_naming_it(gate_setup) -> None:
    _, config, _, _ = gate_setup
    with pytest.raises(AirflowFailException, match="candidate MLflow run 'deadbeef' not found"):
        BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id="deadbeef").execute({})


def test_metric_not_logged_fails_naming_run_and_metric(gate_setup) -> None:
    _, config, _, candidate = gate_setup
    run_id = candidate({"roc_auc": 0.8, "log_loss": 0.3}, None, None)  # no recall: a guardrail
    with pytest.raises(AirflowFailException, match=f"MLflow run {run_id} has no metric candidate_recall"):
        BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id=run_id).execute({})


def test_unscored_champion_fails_with_its_error_unless_forced(gate_setup) -> None:
    hook, config, _, candidate = gate_setup
    from airflow_trainpipe.operators.register import register_candidate

    champion_run = candidate(CHAMPION, None, None)
    register_candidate(
        hook,
        BaselineGateOperator(task_id="g", config=str(config)).config,
        champion_run,
        gate_decision(champion_version=None),
        {},
        log=logging.getLogger("test"),
    )
    broken = candidate(
        CHAMPION, None, "1", **{"trainpipe.champion.error": "cannot score champion: it needs column(s) zip"}
    )
    gate = BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id=broken)
    with pytest.raises(
        AirflowFailException,
        match=r"no metric champion_roc_auc.*champion version 1: cannot score champion: it needs column",
    ):
        gate.execute({})
    gate.force = "True"  # as a template renders it
    report = gate.execute({})
    assert report["promote"] is True and report["forced"] is True


def test_champion_changed_since_scoring_fails(gate_setup) -> None:
    hook, config, model_name, candidate = gate_setup
    from airflow_trainpipe.operators.register import register_candidate

    parsed = BaselineGateOperator(task_id="g", config=str(config)).config
    first = candidate(CHAMPION, None, None)
    stale = candidate({**CHAMPION, "roc_auc": 0.9}, None, None)  # scored while there was no champion yet
    register_candidate(
        hook, parsed, first, gate_decision(champion_version=None), {}, log=logging.getLogger("test")
    )
    with pytest.raises(
        AirflowFailException,
        match=rf"the champion changed since run {stale} was scored: {model_name}@champion was version none, now 1",
    ):
        BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id=stale).execute({})
