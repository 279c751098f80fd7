"""RegisterModelOperator's registration against real MLflow (server with basic auth, embedded sqlite):
idempotent per run, lineage tags, aliases moved, stale champion refused."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.config import load_config
from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.operators.register import RegisterModelOperator
from airflow_trainpipe.registry.versions import ChampionChanged, register_candidate
from tests.helpers.mlflow_backends import BACKENDS, define_connection, gate_decision, write_config
from tests.helpers.mlflow_server import log_candidate_run

LOG = logging.getLogger("test")
METRICS = {"roc_auc": 0.8, "log_loss": 0.3, "recall": 0.5}


def aliases(client, name: str) -> dict[str, str]:
    return {alias: str(version) for alias, version in client.get_registered_model(name).aliases.items()}


def test_template_fields_are_public_api() -> None:
    assert RegisterModelOperator.template_fields == ("mlflow_run_id", "gate_decision")


def test_refuses_a_decision_that_did_not_promote(tmp_path: Path) -> None:
    config = write_config(tmp_path / "p.yaml", "whatever")
    operator = RegisterModelOperator(
        task_id="register",
        config=str(config),
        gate_decision=gate_decision(promote=False, reason="worse").as_dict(),
    )
    with pytest.raises(AirflowFailException, match="the gate did not promote this candidate: worse"):
        operator.execute({})


@pytest.fixture(params=BACKENDS)
def registry(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    define_connection(monkeypatch, request.param, request, tmp_path)
    name = f"reg_{uuid.uuid4().hex[:8]}"
    config = load_config(
        write_config(
            tmp_path / "pipeline.yaml",
            name,
            (("tags: {team: risk-ml}", "tags: {team: risk-ml, tier: gold}"),),
        )
    )
    hook = MlflowHook()
    with hook.activated():
        yield hook, config, name


def test_registration_is_idempotent_and_moves_the_aliases(registry) -> None:
    hook, config, name = registry
    client = hook.get_conn()
    first = log_candidate_run(name, METRICS, None, None, model_name=name)
    bootstrap = gate_decision(champion_version=None, candidate=0.8, champion=None, reason="bootstrap")
    lineage = {
        "trainpipe.pipeline": "fraud_detector",
        "airflow.dag_id": "d",
        "airflow.dag_run_id": "manual__1",
    }
    one = register_candidate(hook, config, first, bootstrap, lineage, log=LOG)
    again = register_candidate(
        hook, config, first, bootstrap, lineage, log=LOG
    )  # a retry, or a re-run of the DAG run
    assert one == {**again, "created": True} and again["created"] is False
    assert one["version"] == "1" and one["previous_version"] is None
    assert len(client.search_model_versions(f"name = '{name}'")) == 1

    second = log_candidate_run(name, {**METRICS, "roc_auc": 0.85}, METRICS, "1", model_name=name)
    better = gate_decision(
        champion_version="1", candidate=0.85, champion=0.8, improvement=0.05, reason="better", forced=False
    )
    lineage = {**lineage, "airflow.dag_run_id": "manual__2"}
    two = register_candidate(hook, config, second, better, lineage, log=LOG)
    assert (two["version"], two["previous_version"], two["previous_alias"]) == ("2", "1", "previous_champion")
    assert register_candidate(hook, config, second, better, lineage, log=LOG)["created"] is False
    assert aliases(client, name) == {"champion": "2", "previous_champion": "1"}
    assert len(client.search_model_versions(f"name = '{name}'")) == 2

    tags = client.get_model_version(name, "2").tags
    assert tags["trainpipe.mlflow_run_id"] == second
    assert tags["trainpipe.champion_compared"] == f"{name}/1"
    assert tags["trainpipe.gate.candidate"] == "0.85" and tags["trainpipe.gate.champion"] == "0.8"
    assert tags["trainpipe.gate.improvement"] == "0.05" and tags["trainpipe.gate.forced"] == "false"
    assert tags["trainpipe.data_digest"] == "sha256:" + "ab" * 32
    assert tags["trainpipe.config_hash"] == config.content_hash  # the run had none: the operator's config
    assert tags["airflow.dag_run_id"] == "manual__2" and tags["trainpipe.pipeline"] == "fraud_detector"
    assert tags["team"] == "risk-ml" and tags["tier"] == "gold"
    assert tags["trainpipe.code_version"]
    assert client.get_model_version(name, "2").current_stage in (None, "None")  # aliases, not stages


def test_a_champion_that_changed_after_the_gate_is_not_replaced(registry) -> None:
    hook, config, name = registry
    client = hook.get_conn()
    first = log_candidate_run(name, METRICS, None, None, model_name=name)
    register_candidate(hook, config, first, gate_decision(champion_version=None), {}, log=LOG)
    late = log_candidate_run(name, METRICS, None, None, model_name=name)  # gated while there was no champion
    with pytest.raises(
        ChampionChanged, match=f"{name}@champion is version 1, but the gate compared against none"
    ):
        register_candidate(hook, config, late, gate_decision(champion_version=None), {}, log=LOG)
    operator = RegisterModelOperator(
        task_id="register",
        config=config,
        mlflow_run_id=late,
        gate_decision=gate_decision(champion_version=None).as_dict(),
    )
    with pytest.raises(AirflowFailException, match="the champion changed in between") as failed:
        operator.execute({})  # the task fails at once: no retry makes a stale comparison fresh
    assert isinstance(failed.value.__cause__, ChampionChanged)
    assert aliases(client, name) == {"champion": "1"}
    forced = register_candidate(
        hook, config, late, gate_decision(champion_version=None, forced=True), {}, log=LOG
    )
    assert forced["version"] == "2" and aliases(client, name) == {"champion": "2", "previous_champion": "1"}


def test_config_hash_ignores_formatting_but_not_settings(tmp_path: Path) -> None:
    base = load_config(write_config(tmp_path / "a.yaml", "m"))
    reformatted = load_config(
        write_config(
            tmp_path / "b.yaml", "m", (("pipeline: fraud_detector", "pipeline:    fraud_detector   # same"),)
        )
    )
    changed = load_config(
        write_config(tmp_path / "c.yaml", "m", (("learning_rate: 0.002", "learning_rate: 0.003"),))
    )
    assert base.content_hash == reformatted.content_hash != changed.content_hash
    assert base.content_hash.startswith("sha256:") and len(base.content_hash) == 71
