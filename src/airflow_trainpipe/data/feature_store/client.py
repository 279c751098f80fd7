"""The Airflow worker's side of the feature store: runs `feature_store.child` in the Feast
interpreter and turns its result into values or exceptions. Imports only the stdlib (and the
package's exception classes): Feast never enters a worker or a DAG parse.

The interpreter is the one given, else `$TRAINPIPE_FEAST_PYTHON` (`make venv` builds
`.venv-feast` and the Makefile points the variable at it). Each call starts one process, which
costs the `import feast` (seconds): callers batch their work into one call.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow_trainpipe.data.sources.errors import SourceError

FEAST_REQUIREMENT = "feast[duckdb]==0.67.0"
ENV_VAR = "TRAINPIPE_FEAST_PYTHON"
TIMEOUT_SECONDS = 6 * 3600  # a retrieval of many millions of rows; a hung child ends at last
_SRC = Path(__file__).resolve().parents[3]  # the directory holding airflow_trainpipe


class FeatureStoreError(SourceError):
    """The feature store cannot give the run's features; `kind` says why (`unknown_feature`,
    `missing_entity_column`, `bad_timestamp`, `offline_store_drops_rows`, `feature_name_collision`,
    `feast_error`, `child_crashed`, `no_feast_python`, ...)."""

    def __init__(self, message: str, kind: str = "feast_error"):
        super().__init__(message)
        self.kind = kind


class FeatureStoreUnavailable(FeatureStoreError):
    """The offline store (or its files, or its endpoint) could not be read: it may come back."""

    retryable = True


@dataclass(frozen=True)
class FeatureViewInfo:
    """A feature view a retrieval used, as the registry defined it then."""

    name: str
    join_keys: tuple[str, ...]
    ttl_seconds: int  # 0: no TTL
    schema: dict[str, str]  # feature -> Feast dtype name (Int64, Float64, String, ...)
    sha256: str  # of the view's definition; the same definitions applied again give the same hash


@dataclass(frozen=True)
class Retrieval:
    """A point-in-time retrieval: `output` holds the entity rows with the features appended."""

    project: str
    features: tuple[str, ...]  # "view:feature", in the output's column order
    views: tuple[FeatureViewInfo, ...]
    rows: int
    output: Path


def feast_python(configured: str | None = None) -> str:
    """The Feast interpreter: `configured`, else $TRAINPIPE_FEAST_PYTHON; it must be executable."""
    python = configured or os.environ.get(ENV_VAR)
    hint = (
        f"`make venv` builds .venv-feast (and the Makefile sets {ENV_VAR} to its python); or install "
        f"{FEAST_REQUIREMENT} with constraints-feast.txt (pip install -c constraints-feast.txt "
        f"'{FEAST_REQUIREMENT}') into any virtualenv and set {ENV_VAR} to its bin/python"
    )
    if not python:
        raise FeatureStoreError(f"no Feast interpreter: {ENV_VAR} is not set; {hint}", "no_feast_python")
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        raise FeatureStoreError(
            f"Feast interpreter {python} is not an executable file; {hint}", "no_feast_python"
        )
    return python


def feast_env() -> dict[str, str]:
    """The child's environment: our package importable (Feast 0.67 sends no usage telemetry:
    it has no switch to turn off)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    return env


def _tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_child(python: str | None, command: str, spec: dict[str, Any]) -> dict[str, Any]:
    """One `child COMMAND` run: its result on success, else the matching exception."""
    interpreter = feast_python(python)
    with tempfile.TemporaryDirectory(prefix="trainpipe-feast-") as tmp:
        spec_file, result_file = Path(tmp) / "spec.json", Path(tmp) / "result.json"
        spec_file.write_text(json.dumps(spec))
        argv = [
            interpreter,
            "-m",
            "airflow_trainpipe.data.feature_store.child",
            command,
            str(spec_file),
            str(result_file),
        ]
        try:
            done = subprocess.run(
                argv, env=feast_env(), capture_output=True, text=True, timeout=TIMEOUT_SECONDS
            )
        except subprocess.TimeoutExpired as exc:
            raise FeatureStoreUnavailable(
                f"feast {command} did not finish within {TIMEOUT_SECONDS} s", "timeout"
            ) from exc
        if done.returncode != 0 or not result_file.exists():
            raise FeatureStoreError(
                f"the Feast child ({interpreter}) of {command} exited with code {done.returncode}:\n"
                f"{_tail(done.stderr or done.stdout)}",
                "child_crashed",
            )
        result: dict[str, Any] = json.loads(result_file.read_text())
    if not result.get("ok"):
        error = FeatureStoreUnavailable if result.get("retryable") else FeatureStoreError
        raise error(str(result.get("message")), str(result.get("kind")))
    return result


def _selection(
    repo: Path,
    output: Path,
    features: list[str] | None,
    feature_service: str | None,
    full_feature_names: bool,
) -> dict[str, Any]:
    """The spec fields a retrieval and an online read share: the repo, what to read, where to."""
    if (features is None) == (feature_service is None):
        raise ValueError("give either features or feature_service")
    return {
        "repo": str(Path(repo).resolve()),
        "features": features,
        "feature_service": feature_service,
        "output": str(Path(output).resolve()),
        "full_feature_names": full_feature_names,
    }


def retrieve(
    *,
    python: str | None,
    repo: Path,
    entity_files: list[Path],
    timestamp_column: str,
    output: Path,
    features: list[str] | None = None,
    feature_service: str | None = None,
    full_feature_names: bool = False,
) -> Retrieval:
    """The entity rows of `entity_files` (concatenated in order) with each feature as of the row's
    `timestamp_column` appended, written to `output` (one Parquet file); nulls where the view has
    no value inside its TTL. Give `features` ("view:feature") or a `feature_service`."""
    spec: dict[str, Any] = {
        **_selection(repo, output, features, feature_service, full_feature_names),
        "entity_files": [str(Path(f).resolve()) for f in entity_files],
        "timestamp_column": timestamp_column,
    }
    result = run_child(python, "retrieve", spec)
    views = tuple(
        FeatureViewInfo(
            v["name"], tuple(v["join_keys"]), int(v["ttl_seconds"]), dict(v["schema"]), v["sha256"]
        )
        for v in result["views"]
    )
    return Retrieval(
        result["project"], tuple(result["features"]), views, int(result["rows"]), Path(spec["output"])
    )


def materialize(
    *, python: str | None, repo: Path, feature_views: list[str], end: datetime, cover_from: datetime
) -> dict[str, Any]:
    """Load `feature_views` into the online store up to `end`; a view's first load starts at
    `cover_from` minus its TTL (the oldest row serving may need), later ones where the last ended.
    Returns {"views": {name: {"start", "end", "first"}}, "seconds"}."""
    spec = {
        "repo": str(Path(repo).resolve()),
        "feature_views": list(feature_views),
        "end": end.isoformat(),
        "cover_from": cover_from.isoformat(),
    }
    result = run_child(python, "materialize", spec)
    return {"views": result["views"], "seconds": result["seconds"]}


def online_features(
    *,
    python: str | None,
    repo: Path,
    entity_file: Path,
    output: Path,
    features: list[str] | None = None,
    feature_service: str | None = None,
    full_feature_names: bool = False,
    as_of: datetime | None = None,
) -> Path:
    """The online store's values for the entities of `entity_file` (Parquet with the join keys),
    written to `output` in its row order: its columns plus the features, typed as `retrieve`'s.
    `as_of` (serving: now): a value older than its view's TTL then is null, as the historical
    join makes it; None: whatever the store holds."""
    spec: dict[str, Any] = {
        **_selection(repo, output, features, feature_service, full_feature_names),
        "entity_file": str(Path(entity_file).resolve()),
        "as_of": None if as_of is None else as_of.isoformat(),  # naive: UTC, as in the child
    }
    run_child(python, "online", spec)
    return Path(spec["output"])


def apply(*, python: str | None, repo: Path) -> None:
    """`feast apply` in `repo`: registers its definitions and creates its online tables."""
    argv = [feast_python(python), "-m", "feast.cli.cli", "apply"]
    done = subprocess.run(argv, cwd=repo, env=feast_env(), capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise FeatureStoreError(
            f"feast apply in {repo} exited with code {done.returncode}:\n{_tail(done.stderr or done.stdout)}"
        )
