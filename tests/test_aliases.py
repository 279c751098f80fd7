"""`trainpipe promote` and `trainpipe rollback` on versions the register task created, against the
embedded store and a real `mlflow server`: the aliases move as a pipeline moves them, and every
move says on the versions who made it and why."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.config import load_config
from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.operators.register import register_candidate
from tests.helpers.mlflow_backends import BACKENDS, define_connection, gate_decision, write_config
from tests.helpers.mlflow_server import log_candidate_run

METRICS = {"roc_auc": 0.8, "log_loss": 0.3, "recall": 0.5}


@pytest.fixture(params=BACKENDS)
def registered(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Versions 1 and 2 registered by the register task: 2 is @champion, 1 @previous_champion."""
    define_connection(monkeypatch, request.param, request, tmp_path)
    name = f"aliases_{uuid.uuid4().hex[:8]}"
    config = load_config(write_config(tmp_path / "pipeline.yaml", name))
    hook = MlflowHook()
    for champion_version in (None, "1"):
        with hook.activated():
            run_id = log_candidate_run(name, METRICS, None, champion_version, model_name=name)
        decision = gate_decision(champion_version=champion_version)
        register_candidate(hook, config, run_id, decision, {}, log=logging.getLogger("test"))
    return hook, name


def _state(hook: MlflowHook, name: str) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    with hook.activated():
        client = hook.get_conn()
        aliases = {alias: str(v) for alias, v in client.get_registered_model(name).aliases.items()}
        tags = {
            v: {
                k: t
                for k, t in client.get_model_version(name, v).tags.items()
                if k.endswith(("_by", "_reason"))
            }
            for v in ("1", "2")
        }
    return aliases, tags


def test_rollback_then_promote(registered, capsys: pytest.CaptureFixture[str]) -> None:
    hook, name = registered
    assert _state(hook, name)[0] == {"champion": "2", "previous_champion": "1"}
    # An unknown version or model changes nothing.
    assert trainpipe(["promote", name, "9", "--reason", "typo"]) == 1
    assert f"trainpipe promote: {name} has no version 9" in capsys.readouterr().err
    assert trainpipe(["rollback", "no_such_model", "--reason", "x"]) == 1
    assert "no_such_model@previous_champion does not exist" in capsys.readouterr().err
    assert _state(hook, name)[0] == {"champion": "2", "previous_champion": "1"}

    assert trainpipe(["rollback", name, "--reason", "flags every online payment", "--by", "alice"]) == 0
    assert capsys.readouterr().out == f"{name} version 1 is now @champion (was version 2)\n"
    aliases, tags = _state(hook, name)
    assert aliases == {"champion": "1"}  # a second rollback cannot re-promote version 2
    assert tags["2"] == {
        "trainpipe.rolled_back_by": "alice",
        "trainpipe.rolled_back_reason": "flags every online payment",
    }
    assert tags["1"] == {
        "trainpipe.restored_by": "alice",
        "trainpipe.restored_reason": "flags every online payment",
    }

    assert trainpipe(["rollback", name, "--reason", "again"]) == 1
    assert (
        f"{name}@previous_champion does not exist: there is nothing to roll back to"
        in capsys.readouterr().err
    )
    assert _state(hook, name)[0] == {"champion": "1"}

    assert trainpipe(["promote", name, "2", "--reason", "upstream fixed", "--by", "bob"]) == 0
    assert capsys.readouterr().out == (
        f"{name} version 2 is now @champion (was version 1), version 1 is @previous_champion\n"
    )
    aliases, tags = _state(hook, name)
    assert aliases == {"champion": "2", "previous_champion": "1"}
    assert (
        tags["2"]["trainpipe.promoted_by"] == "bob"
        and tags["2"]["trainpipe.promoted_reason"] == "upstream fixed"
    )

    assert trainpipe(["promote", name, "2", "--reason", "twice"]) == 0
    assert capsys.readouterr().out == f"{name} version 2 is @champion already\n"
    assert _state(hook, name)[0] == {"champion": "2", "previous_champion": "1"}


def test_a_reason_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        trainpipe(["rollback", "m"])
    assert "--reason" in capsys.readouterr().err
