"""`trainpipe reproduce`: a registered version trained again from its run's spec.json, compared
metric by metric and by the weights' sha256."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.contracts.artifacts import library_versions
from airflow_trainpipe.registry.reads import RegistryError
from airflow_trainpipe.registry.reproduce import Logged, compare, parse_reference
from tests.helpers.jobs import uninterrupted_run

RESULT = {
    "weights_sha256": "ab" * 32,
    "world_size": 2,
    "resumed_from_step": 0,
    "holdout_metrics": {"roc_auc": 0.81, "log_loss": 0.3, "pr_auc": "NaN"},
    "evaluation": {"candidate": {"roc_auc": 0.8, "threshold": 0.2}},
}


def _logged(**tags: str) -> Logged:
    return Logged("m", "3", "run", {}, RESULT, {"trainpipe.code_version": _code(), **tags})


def _code() -> str:
    from airflow_trainpipe import __version__

    return __version__


def test_references_name_an_alias_or_a_version() -> None:
    assert parse_reference("fraud_detector@champion") == ("fraud_detector", "champion", None)
    assert parse_reference("fraud.eu/12") == ("fraud.eu", None, "12")
    for bad in ("fraud_detector", "fraud_detector/latest", "@champion", "m@"):
        with pytest.raises(RegistryError, match="expected MODEL@ALIAS or MODEL/VERSION"):
            parse_reference(bad)


def test_the_same_weights_and_metrics_are_identical_nan_included() -> None:
    comparison = compare(_logged(), json.loads(json.dumps(RESULT)))
    assert comparison.identical and comparison.causes == []
    assert [row[0] for row in comparison.rows] == [
        "weights sha256", "holdout log_loss", "holdout pr_auc", "holdout roc_auc", "final roc_auc", "final threshold",
    ]  # fmt: skip


def test_a_difference_is_marked_and_explained() -> None:
    now = library_versions()
    then = {**now, "torch": "2.0.0"}
    logged = _logged(**{"trainpipe.libraries": json.dumps(then), "trainpipe.code_version": "0.0.1"})
    reproduced = {
        **RESULT,
        "weights_sha256": "cd" * 32,
        "world_size": 1,
        "holdout_metrics": {**RESULT["holdout_metrics"], "roc_auc": 0.8101},
    }
    comparison = compare(logged, reproduced)
    assert not comparison.identical
    assert "roc_auc" in next(
        line
        for line in comparison.table().splitlines()
        if line.endswith("<- differs") and "holdout roc_auc" in line
    )
    assert comparison.causes[0].startswith("code version: trained with airflow-trainpipe 0.0.1")
    assert "world size: 2 then, 1 now" in comparison.causes
    assert f"library versions: torch 2.0.0 -> {now['torch']}" in comparison.causes


def test_a_spec_that_no_longer_loads_or_data_that_is_gone_is_said_before_any_job(tmp_path: Path) -> None:
    """A spec.json of another version was a pydantic traceback; a deleted snapshot file a job
    that failed on a bare 'No such file or directory'."""
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.registry.reproduce import reproduction_spec
    from tests.helpers.jobs import job_config

    with pytest.raises(RegistryError, match=r"m version 3's logged spec.json does not load in this version"):
        reproduction_spec(Logged("m", "3", "run", {"config": {}, "run_id": 7}, RESULT, {}), "again")
    gone = (tmp_path / "part-00000.parquet").as_uri()
    spec = TrainSpec(config=job_config(tmp_path), run_id="first", data_files=[gone])
    logged = Logged("m", "3", "run", json.loads(spec.to_json()), RESULT, {})
    with pytest.raises(RegistryError, match=rf"m version 3 trained on {gone}, which no longer exists"):
        reproduction_spec(logged, "again")


@pytest.mark.slow
def test_a_registered_version_trains_again_into_the_same_model(
    tmp_path_factory: pytest.TempPathFactory,
    trainpipe_home: Path,
    job_files: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from mlflow import MlflowClient
    from mlflow.tracking._tracking_service import utils

    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)  # the session's embedded store
    run = uninterrupted_run(tmp_path_factory, job_files)  # shared with the resume and serving tests
    assert run.result is not None
    store = f"sqlite:///{trainpipe_home / 'mlflow.db'}"
    monkeypatch.setattr(
        utils, "_tracking_uri", store
    )  # `models:/m-...` sources resolve there; restored after
    client = MlflowClient(store)
    client.create_registered_model("reproduce_test")
    version = client.create_model_version(
        "reproduce_test", run.result["model_uri"], run_id=run.result["mlflow_run_id"]
    ).version
    client.set_registered_model_alias("reproduce_test", "champion", version)

    assert trainpipe(["reproduce", "reproduce_test@champion"]) == 0
    out = capsys.readouterr().out
    assert f"reproducing reproduce_test version {version} (MLflow run {run.result['mlflow_run_id']})" in out
    assert out.rstrip().endswith("identical: the same weights and every metric, bit for bit")
    [weights] = [line for line in out.splitlines() if line.startswith("weights sha256")]
    assert weights.split() == ["weights", "sha256", *[run.result["weights_sha256"][:19] + "..."] * 2]
    experiment = client.get_run(run.result["mlflow_run_id"]).info.experiment_id
    [again] = client.search_runs([experiment], f"tags.`trainpipe.reproduces` = 'reproduce_test/{version}'")
    assert json.loads(again.data.tags["trainpipe.libraries"]) == library_versions()

    # A run that logged no spec (trained before reproducing existed) is named, not retrained.
    bare = client.create_run(experiment)
    client.set_terminated(bare.info.run_id)
    old = client.create_model_version(
        "reproduce_test", run.result["model_uri"], run_id=bare.info.run_id
    ).version
    assert trainpipe(["reproduce", f"reproduce_test/{old}"]) == 1
    assert (
        "has no spec.json (deleted from its artifacts, or trained before runs logged what reproducing needs)"
        in (capsys.readouterr().err)
    )
