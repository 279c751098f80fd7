"""`trainpipe snapshots gc` on a store two pipelines share: what a registered version, a recent
run or a recent use needs stays; the rest goes only with --delete; a registry that cannot be read
stops it before anything is deleted."""

from __future__ import annotations

import os
import time
from datetime import date
from pathlib import Path

import pytest
import yaml

from airflow_trainpipe.cli import main as trainpipe
from airflow_trainpipe.config import load_config
from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.core.storage import local_path
from airflow_trainpipe.data.freeze import snapshot_for_date
from airflow_trainpipe.data.snapshots.manifests import load_manifest
from tests.helpers import warehouse

DAYS = [date(2026, 2, d) for d in range(1, 8)]
OLD = time.time() - 40 * 86_400


@pytest.fixture(scope="module")
def warehouse_url(postgres_server) -> str:
    url = warehouse.create_database(postgres_server.url, "retention_tests")
    warehouse.load_days(url, DAYS, 200)
    return url


def _pipeline(folder: Path, name: str) -> Path:
    """A sql pipeline under `folder`; every pipeline made here shares folder/snapshots."""
    config = yaml.safe_load(warehouse.sql_config(folder, partitions=2).read_text())
    config["pipeline"] = name
    config["register"]["model_name"] = name
    config["data"]["uri"] = (folder / name).as_uri()
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _age(manifest: Manifest, store: Path, pipeline: str, when: float) -> None:
    use = store / "uses" / pipeline / f"{manifest.digest.removeprefix('sha256:')}.json"
    os.utime(use, (when, when))


def _register(name: str, digest: str, by_hand: bool = False) -> None:
    """A registered version trained on `digest`, on the embedded MLflow store. `by_hand`: as a
    person registers a run (a hotfix): the digest is on the run only, not copied to the version."""
    from mlflow import MlflowClient

    from airflow_trainpipe.core.tracking_store import default_tracking_uri

    client = MlflowClient(default_tracking_uri(), default_tracking_uri())
    experiment = client.create_experiment(f"{name}-registry")
    run = client.create_run(experiment, tags={"trainpipe.data_digest": digest})
    client.set_terminated(run.info.run_id)
    client.create_registered_model(name)
    client.create_model_version(
        name, "file:///nowhere", run.info.run_id, tags=None if by_hand else {"trainpipe.data_digest": digest}
    )


def _files(manifest: Manifest) -> list[Path]:
    return [local_path(f.uri) for f in manifest.files]


@pytest.mark.parametrize("by_hand", [False, True], ids=["registered_by_the_task", "registered_by_hand"])
def test_gc_keeps_what_versions_runs_and_recent_uses_read_and_deletes_only_when_told(
    warehouse_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    by_hand: bool,
) -> None:
    """A version registered by hand has its data digest on its run alone: gc deleted the data of
    a hotfix version that `trainpipe promote` had made the champion."""
    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", warehouse_url)
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("AIRFLOW_CONN_MLFLOW_DEFAULT", raising=False)
    store = tmp_path / "snapshots"
    a, b = _pipeline(tmp_path, "pipeline_a"), _pipeline(tmp_path, "pipeline_b")
    registered = snapshot_for_date(load_config(a), "2026-02-03")  # window 02-02 .. 02-03
    unreferenced = snapshot_for_date(load_config(a), "2026-02-05")
    recent = snapshot_for_date(load_config(b), "2026-02-07")  # b's: gc is given only a's config
    _register("pipeline_a", registered.digest, by_hand)
    for manifest, pipeline in ((registered, "pipeline_a"), (unreferenced, "pipeline_a")):
        _age(manifest, store, pipeline, OLD)
    (store / "sha256" / "00").mkdir(parents=True)
    stray = store / "sha256" / "00" / "00stray.parquet"  # a file no snapshot lists
    stray.write_bytes(b"x")

    assert trainpipe(["snapshots", "gc", str(a)]) == 0
    dry = capsys.readouterr().out
    assert f"keep {registered.digest}: pipeline_a version 1" in dry
    assert f"keep {recent.digest}: used by pipeline_b within the retention age" in dry
    assert "would delete (dry run; --delete to delete) 2 file(s)" in dry and "and 1 use record(s)" in dry
    assert all(p.exists() for p in [*_files(unreferenced), stray])

    assert trainpipe(["snapshots", "gc", str(a), "--delete"]) == 0
    assert not any(p.exists() for p in [*_files(unreferenced), stray])
    assert all(p.exists() for p in [*_files(registered), *_files(recent)])
    assert load_manifest(load_config(a).data, registered.digest) == registered  # still verifies
    assert not (
        store / "uses" / "pipeline_a" / f"{unreferenced.digest.removeprefix('sha256:')}.json"
    ).exists()
    capsys.readouterr()

    # Past the retention age, b's snapshot stays only while a version or a run needs it.
    _age(recent, store, "pipeline_b", OLD)
    assert trainpipe(["snapshots", "gc", str(a), "--keep", "12h"]) == 0
    kept, going = capsys.readouterr().out.split("would delete")
    assert recent.digest not in kept and all(str(path) in going for path in _files(recent))


def test_a_registry_that_cannot_be_read_deletes_nothing(
    warehouse_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.conftest import free_port

    monkeypatch.setenv("AIRFLOW_CONN_WAREHOUSE", warehouse_url)
    monkeypatch.setenv("TRAINPIPE_HOME", str(tmp_path / "home"))
    a = _pipeline(tmp_path, "pipeline_a")
    old = snapshot_for_date(load_config(a), "2026-02-03")
    _age(old, tmp_path / "snapshots", "pipeline_a", OLD)
    monkeypatch.setenv("AIRFLOW_CONN_MLFLOW_DEFAULT", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")
    assert trainpipe(["snapshots", "gc", str(a), "--delete"]) == 1
    err = capsys.readouterr().err
    assert "cannot list the versions of pipeline_a" in err and err.rstrip().endswith("nothing deleted")
    assert all(p.exists() for p in _files(old))
