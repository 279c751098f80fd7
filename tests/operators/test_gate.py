"""BaselineGateOperator against real MLflow runs (real server with basic auth, and embedded sqlite).

The rule matrix itself is tested in tests/registry/test_promotion.py; here: reading both metric sets from
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
from airflow_trainpipe.registry import reads
from airflow_trainpipe.registry.reads import RegistryError
from airflow_trainpipe.registry.versions import register_candidate
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
        assert artifacts == {"gate/decision.json", "gate/comparison.png", "gate/report.html"}
        local = client.download_artifacts(run_id, "gate")
        assert json.loads((Path(local) / "decision.json").read_text()) == report
        assert (Path(local) / "comparison.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        page = (Path(local) / "report.html").read_text()
        assert "<b>PROMOTE</b>: no champion yet: roc_auc = 0.8 reaches no_champion.min_value" in page
        assert page.count("<svg") == 1  # the per-metric bars: no curves were logged by this stand-in run
        assert client.get_run(run_id).data.tags["trainpipe.gate.promote"] == "true"


def test_missing_run_fails_naming_it(gate_setup) -> None:
    _, config, _, _ = gate_setup
    with pytest.raises(RegistryError, match="candidate MLflow run 'deadbeef' not found") as caught:
        BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id="deadbeef").execute({})
    assert type(caught.value) is RegistryError and caught.value.retryable is False  # fails at once


def test_metric_not_logged_fails_naming_run_and_metric(gate_setup) -> None:
    _, config, _, candidate = gate_setup
    run_id = candidate({"roc_auc": 0.8, "log_loss": 0.3}, None, None)  # no recall: a guardrail
    with pytest.raises(AirflowFailException, match=f"MLflow run {run_id} has no metric candidate_recall"):
        BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id=run_id).execute({})


def test_unscored_champion_fails_with_its_error_unless_forced(gate_setup) -> None:
    hook, config, _, candidate = gate_setup
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


def test_with_confidence_the_interval_logged_by_the_job_decides(
    gate_setup, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    hook, _, model_name, candidate = gate_setup
    config = write_config(
        tmp_path / "confident.yaml",
        model_name,
        (("min_improvement: 0.001", "min_improvement: 0.001\n  confidence: 0.95"),),
    )
    parsed = BaselineGateOperator(task_id="g", config=str(config)).config
    register_candidate(
        hook,
        parsed,
        candidate(CHAMPION, None, None),
        gate_decision(champion_version=None),
        {},
        log=logging.getLogger("t"),
    )
    better = {**CHAMPION, "roc_auc": 0.85}
    noisy = candidate(better, CHAMPION, "1")
    with hook.activated():  # as the training job logs it beside candidate_* and champion_*
        hook.get_conn().log_metric(noisy, "improvement_lower", -0.01)
        hook.get_conn().log_metric(noisy, "improvement_upper", 0.11)
    # A losing decision skips downstream tasks, which needs a task instance: decided here, as
    # execute() decides, from what the run logged.
    gate = BaselineGateOperator(task_id="gate", config=str(config))
    decision = gate._decide(hook, noisy, hook.call(reads.run_evaluation, noisy), force=False)
    assert decision.promote is False and decision.improvement_interval == (-0.01, 0.11)
    assert decision.reason.startswith(
        "not significant: the 95% interval of the roc_auc improvement is [-0.01, 0.11]"
    )

    unmeasured = candidate(better, CHAMPION, "1")  # a run that computed no interval
    decision = gate._decide(hook, unmeasured, hook.call(reads.run_evaluation, unmeasured), force=False)
    assert decision.promote is False and "was computed for this candidate: not significant" in decision.reason

    significant = candidate(better, CHAMPION, "1")
    with hook.activated():
        hook.get_conn().log_metric(significant, "improvement_lower", 0.02)
        hook.get_conn().log_metric(significant, "improvement_upper", 0.09)
    report = BaselineGateOperator(task_id="gate", config=str(config), mlflow_run_id=significant).execute({})
    assert report["promote"] is True and report["confidence"] == 0.95
    assert "95% interval [0.02, 0.09]" in report["reason"]


def test_a_slice_regression_in_the_run_s_evaluation_blocks_the_candidate(gate_setup, tmp_path: Path) -> None:
    hook, _, model_name, candidate = gate_setup
    config = write_config(
        tmp_path / "sliced.yaml",
        model_name,
        (
            ("threshold: max_f1               #", "threshold: max_f1\n  slices: [{column: channel}]  #"),
            ("min_improvement: 0.001", "min_improvement: 0.001\n  slice_guardrail: {max_regression: 0.01}"),
        ),
    )
    gate = BaselineGateOperator(task_id="gate", config=str(config))
    register_candidate(
        hook,
        gate.config,
        candidate(CHAMPION, None, None),
        gate_decision(champion_version=None),
        {},
        log=logging.getLogger("t"),
    )
    better = {**CHAMPION, "roc_auc": 0.85}
    run_id = candidate(better, CHAMPION, "1")
    unsliced = candidate(better, CHAMPION, "1")
    with hook.activated():  # the job's evaluation.json: both models per slice
        hook.get_conn().log_dict(
            run_id,
            {
                "slices": [
                    {
                        "slice": "channel=pos",
                        "rows": 300,
                        "candidate": {**better, "roc_auc": 0.9},
                        "champion": CHAMPION,
                    },
                    {
                        "slice": "channel=web",
                        "rows": 200,
                        "candidate": {**better, "roc_auc": 0.7},
                        "champion": CHAMPION,
                    },
                ]
            },
            "evaluation.json",
        )
    gate.mlflow_run_id = run_id
    _, evaluation, _ = gate._evaluation({}, hook)
    decision = gate._decide(hook, run_id, evaluation, force=False)
    assert decision.promote is False
    assert decision.reason.startswith("slice channel=web (200 rows): roc_auc worsens by 0.1")
    assert [c.slice for c in decision.slice_checks] == ["channel=pos", "channel=web"]

    gate.mlflow_run_id = unsliced  # logged no evaluation.json: the guardrail cannot hold
    _, evaluation, _ = gate._evaluation({}, hook)
    assert evaluation.slices is None
    assert gate._decide(hook, unsliced, evaluation, force=False).reason.startswith(
        "no slice metrics were computed"
    )

    # The whole task on the sliced run reads its evaluation.json once, for the slices and the
    # report's curves alike (../shared/FOUND.md: it was downloaded twice).
    downloads: list[str] = []
    logged_evaluation = reads.logged_evaluation

    def counted(client, run: str) -> dict | None:
        downloads.append(run)
        return logged_evaluation(client, run)

    gate.mlflow_run_id = run_id
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reads, "logged_evaluation", counted)
        pushed: dict = {}
        context = {  # what execute reads of a kept champion's context: no downstream task to skip
            "ti": type(
                "TI",
                (),
                {
                    "dag_id": "d",
                    "task_id": "gate",
                    "run_id": "r",
                    "map_index": -1,
                    "xcom_push": lambda self, key, value: pushed.update({key: value}),
                },
            )(),
            "task": type("Task", (), {"get_flat_relatives": lambda self, upstream: []})(),
        }
        assert gate.execute(context)["promote"] is False
    assert downloads == [run_id] and pushed["return_value"]["promote"] is False
