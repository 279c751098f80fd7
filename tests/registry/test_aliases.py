"""`trainpipe promote` and `trainpipe rollback` on versions the register task created, against the
embedded store and a real `mlflow server`: the aliases move as a pipeline moves them, and every
move says on the versions who made it and why."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path

import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.config import load_config
from airflow_trainpipe.hooks.mlflow import MlflowHook
from airflow_trainpipe.registry.versions import find_or_create_version, register_candidate
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
    assert capsys.readouterr().out == f"{name} version 2 is @champion already: nothing moved\n"
    assert _state(hook, name)[0] == {"champion": "2", "previous_champion": "1"}
    # The registry reads "02" as version 2: it is the champion already, not a version replacing
    # itself (which made @previous_champion version 2 and lost the rollback target).
    assert trainpipe(["promote", name, "02", "--reason", "padded"]) == 0
    assert capsys.readouterr().out == f"{name} version 2 is @champion already: nothing moved\n"
    assert _state(hook, name)[0] == {"champion": "2", "previous_champion": "1"}


def test_another_alias_keeps_its_own_rollback_target(registered, capsys: pytest.CaptureFixture[str]) -> None:
    """Moving @staging used to send the version it replaced to @previous_champion: the champion's
    rollback then restored a version that was never the champion."""
    hook, name = registered
    assert trainpipe(["promote", name, "1", "--alias", "staging", "--reason", "try"]) == 0
    assert capsys.readouterr().out == f"{name} version 1 is now @staging (no version held it before)\n"
    assert trainpipe(["promote", name, "2", "--alias", "staging", "--reason", "try"]) == 0
    assert capsys.readouterr().out == (
        f"{name} version 2 is now @staging (was version 1), version 1 is @previous_staging\n"
    )
    assert _state(hook, name)[0] == {
        "champion": "2",
        "previous_champion": "1",
        "staging": "2",
        "previous_staging": "1",
    }
    assert (
        trainpipe(
            ["promote", name, "1", "--alias", "staging", "--previous-alias", "staging", "--reason", "x"]
        )
        == 1
    )
    assert "cannot go to @staging, the alias being moved" in capsys.readouterr().err


def test_a_reason_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        trainpipe(["rollback", "m"])
    assert "--reason" in capsys.readouterr().err


@pytest.mark.slow
def test_a_feature_store_version_has_its_views_loaded_online_before_the_alias_moves(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, tmp_path: Path, capsys
) -> None:
    """As the register and promote tasks do: the version about to be @champion (promoted, or
    restored by a rollback) has the feature views its run trained on loaded into the online store
    first, as the config its run logged says; if they cannot be loaded, no alias moves."""
    import shutil

    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from tests.helpers.feast_repo import START, feast_repo

    define_connection(monkeypatch, "embedded", request, tmp_path)
    example = feast_repo(tmp_path / "feast", days=1, rows=400)
    name = f"aliases_{uuid.uuid4().hex[:8]}"
    store = (
        "  format: parquet\n  feature_store:\n"
        f"    repo: {example.repo}\n    features: [card_activity:txn_count_7d]\n    timestamp_column: event_time\n"
    )
    config = load_config(write_config(tmp_path / "features.yaml", name, (("  format: parquet\n", store),)))
    spec = TrainSpec(
        config=config, run_id="trained", data_files=[f.as_uri() for f in example.transaction_files]
    )
    hook = MlflowHook()
    start = f"{START.isoformat()}T00:00:00+00:00"
    with hook.activated():
        client = hook.get_conn()
        for number in (1, 2):
            run_id = log_candidate_run(
                name,
                METRICS,
                None,
                None,
                model_name=name,
                tags={
                    "trainpipe.feast_feature_views": "card_activity",
                    "trainpipe.feast_entity_time": f"{start} .. {start}",
                },
            )
            client.log_dict(run_id, json.loads(spec.to_json()), "spec.json")  # as the job logs them
            client.log_dict(run_id, {"final_step": 1}, "result.json")
            version, _ = find_or_create_version(client, name, client.get_run(run_id), "test")
            assert version == str(number)
        hook.move_alias(name, "champion", "1", None, None)

    # The card table went away: version 2's views cannot be loaded, so @champion stays on 1.
    moved = example.card_activity.with_suffix(".moved")
    shutil.move(example.card_activity, moved)
    assert trainpipe(["promote", name, "2", "--reason", "hotfix"]) == 1
    assert "so the champion does not move" in capsys.readouterr().err
    assert _state(hook, name)[0] == {"champion": "1"}

    shutil.move(moved, example.card_activity)
    assert trainpipe(["promote", name, "2", "--reason", "hotfix"]) == 0
    out = capsys.readouterr().out
    assert "materialised feature view card_activity into the online store" in out, out
    assert out.endswith(
        f"{name} version 2 is now @champion (was version 1), version 1 is @previous_champion\n"
    )
    assert trainpipe(["rollback", name, "--reason", "flags every online payment"]) == 0
    out = capsys.readouterr().out
    assert "materialised feature view card_activity" in out and "incremental" in out, out
    assert _state(hook, name)[0] == {"champion": "1"}
    with hook.activated():
        for version in ("1", "2"):
            tags = hook.get_conn().get_model_version(name, version).tags
            assert tags["trainpipe.feast_materialized_views"] == "card_activity", (version, tags)
