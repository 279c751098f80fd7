"""`trainpipe snapshots gc`: delete the frozen files no snapshot worth keeping reads.

The store records each use of a snapshot (`<store>/uses/<pipeline>/<digest>.json`, rewritten
on every run that freezes it), so gc sees every pipeline that shares the store, not only the
configs it was given. A snapshot is kept when:
- a registered version of a pipeline that used it was trained on it (its `trainpipe.data_digest`
  tag, or its run's for a version registered by hand): the model must stay reproducible;
- an MLflow run of such a pipeline younger than the retention age trained on it;
- it was used within the retention age (a run between validation and training has no MLflow
  run yet).
Every file a kept snapshot lists stays; the store's other files and the use records of snapshots
not kept go. Nothing is deleted unless every pipeline's registry and runs could be read: an
outage that hid a registered version would otherwise delete the data that reproduces it.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.tags import DATA_DIGEST_TAG
from airflow_trainpipe.core.storage import filesystem, join, resolve
from airflow_trainpipe.registry.reads import RegistryUnavailable

if TYPE_CHECKING:
    from airflow_trainpipe.hooks.mlflow import MlflowHook

# Half-written copies (`.<name>.<uuid>.partial`) older than this belong to a dead writer.
PARTIAL_AGE_S = 24 * 3600


@dataclass(frozen=True)
class Use:
    """One pipeline's use of one snapshot, as the store recorded it."""

    uri: str
    pipeline: str
    registered_model: str
    digest: str
    files: tuple[str, ...]
    used: float  # seconds since the epoch


@dataclass
class GcPlan:
    store: str
    kept: dict[str, str] = field(default_factory=dict)
    """Digest of each kept snapshot -> why."""
    delete_files: list[tuple[str, int]] = field(default_factory=list)
    """(path, bytes) of the store's files no kept snapshot reads."""
    delete_uses: list[str] = field(default_factory=list)

    @property
    def freed_bytes(self) -> int:
        return sum(size for _, size in self.delete_files)


def uses(store: str, conn_id: str | None = None) -> list[Use]:
    fs, root = filesystem(join(resolve(store), "uses"), conn_id)
    try:
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        return []
    found = []
    for path, entry in sorted(listing.items()):
        if not path.endswith(".json"):
            continue
        document = json.loads(fs.cat_file(path))
        manifest = document["manifest"]
        found.append(
            Use(
                uri=path,
                pipeline=document["pipeline"],
                registered_model=document["registered_model"],
                digest=manifest["digest"],
                files=tuple(f["uri"] for f in manifest["files"]),
                used=_modified(entry),
            )
        )
    return found


def _modified(entry: dict[str, Any]) -> float:
    """A listing entry's modification time: local files give `mtime`, S3 `LastModified`."""
    value = entry.get("mtime", entry.get("LastModified", entry.get("last_modified")))
    if value is None:
        return time.time()  # unknown: as if written now, so it is kept
    return float(value.timestamp()) if hasattr(value, "timestamp") else float(value)


def referenced_digests(
    found: list[Use], hook: MlflowHook, younger_than: timedelta, now: float
) -> dict[str, str]:
    """Data digests that must stay: every registered version's, every recent run's, of each
    pipeline that used the store. RegistryUnavailable when any cannot be read."""
    kept: dict[str, str] = {}
    with hook.activated():
        client = hook.get_conn()
        for model in sorted({u.registered_model for u in found}):
            for digest, why in _registered(client, model).items():
                kept.setdefault(digest, why)
        for pipeline in sorted({u.pipeline for u in found}):
            for digest, why in _recent_runs(client, pipeline, younger_than, now).items():
                kept.setdefault(digest, why)
    return kept


def _registered(client: Any, model: str) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    from airflow_trainpipe.registry.reads import is_not_found

    try:
        versions = client.search_model_versions(f"name = '{model}'")
    except MlflowException as exc:
        if is_not_found(exc):
            return {}
        raise RegistryUnavailable(f"cannot list the versions of {model}: {exc.message}") from exc
    except Exception as exc:  # a server that does not answer at all
        raise RegistryUnavailable(f"cannot list the versions of {model}: {exc}") from exc
    kept = {}
    for version in versions:
        digest = (version.tags or {}).get(DATA_DIGEST_TAG) or _run_digest(client, model, version)
        if digest:
            kept[digest] = f"{model} version {version.version}"
    return kept


def _run_digest(client: Any, model: str, version: Any) -> str | None:
    """The data digest of the run a version was registered from: the register task copies it
    onto the version, a version registered by hand (a hotfix, later promoted) has it on its run
    alone. None: the run recorded none, or it no longer exists."""
    from mlflow.exceptions import MlflowException

    from airflow_trainpipe.registry.reads import is_not_found

    if not version.run_id:
        return None
    try:
        return client.get_run(version.run_id).data.tags.get(DATA_DIGEST_TAG)
    except MlflowException as exc:
        if is_not_found(exc):
            return None
        raise RegistryUnavailable(
            f"cannot read the run of {model} version {version.version}: {exc.message}"
        ) from exc
    except Exception as exc:
        raise RegistryUnavailable(f"cannot read the run of {model} version {version.version}: {exc}") from exc


def _recent_runs(client: Any, pipeline: str, younger_than: timedelta, now: float) -> dict[str, str]:
    from mlflow.exceptions import MlflowException

    try:
        experiment = client.get_experiment_by_name(pipeline)
        if experiment is None:
            return {}
        since = int((now - younger_than.total_seconds()) * 1000)
        runs = client.search_runs(
            [experiment.experiment_id], filter_string=f"attributes.start_time >= {since}"
        )
    except MlflowException as exc:
        raise RegistryUnavailable(f"cannot list the recent runs of {pipeline}: {exc.message}") from exc
    except Exception as exc:
        raise RegistryUnavailable(f"cannot list the recent runs of {pipeline}: {exc}") from exc
    return {
        run.data.tags[DATA_DIGEST_TAG]: f"{pipeline} run {run.info.run_id}"
        for run in runs
        if run.data.tags.get(DATA_DIGEST_TAG)
    }


def plan(
    store: str,
    found: list[Use],
    referenced: dict[str, str],
    younger_than: timedelta,
    now: float,
    conn_id: str | None = None,
) -> GcPlan:
    """What a gc of `store` keeps and deletes, given the digests that must stay."""
    result = GcPlan(store=resolve(store))
    cutoff = now - younger_than.total_seconds()
    keep_files: set[str] = set()
    for use in found:
        why = referenced.get(use.digest) or (
            f"used by {use.pipeline} within the retention age" if use.used >= cutoff else None
        )
        if why is None:
            result.delete_uses.append(use.uri)
            continue
        result.kept.setdefault(use.digest, why)
        keep_files.update(use.files)
    fs, root = filesystem(join(result.store, "sha256"), conn_id)
    try:
        listing = fs.find(root, detail=True)
    except FileNotFoundError:
        listing = {}
    for path, entry in sorted(listing.items()):
        name, size = path.rsplit("/", 1)[-1], int(entry.get("size") or 0)
        if name.startswith(".") and name.endswith(".partial"):
            if now - _modified(entry) > PARTIAL_AGE_S:
                result.delete_files.append((path, size))
        elif _uri(result.store, path) not in keep_files:
            result.delete_files.append((path, size))
    return result


def _uri(store: str, path: str) -> str:
    scheme = store.split("://", 1)[0]
    return f"{scheme}://{path.removeprefix('/') if scheme != 'file' else path}"


def describe(result: GcPlan, deleting: bool) -> str:
    """What the plan keeps and why, and what it deletes (or would)."""
    verb = "deleting" if deleting else "would delete (dry run; --delete to delete)"
    lines = [f"store {result.store}: {len(result.kept)} snapshot(s) kept"]
    lines += [f"  keep {digest}: {why}" for digest, why in sorted(result.kept.items())]
    lines.append(
        f"{verb} {len(result.delete_files)} file(s), {result.freed_bytes / 2**20:.1f} MiB, "
        f"and {len(result.delete_uses)} use record(s) of snapshots not kept"
    )
    lines += [f"  {path}" for path, _ in result.delete_files]
    return "\n".join(lines)


def apply(result: GcPlan, conn_id: str | None = None) -> None:
    """Delete the files first, then the use records: a crash in between leaves only records of
    snapshots that are not kept, which the next gc drops."""
    fs, _ = filesystem(result.store, conn_id)
    for path, _size in result.delete_files:
        fs.rm_file(path)
    for path in result.delete_uses:
        fs.rm_file(path)
