"""Where pretrained weights come from: a configured URI pinned to exact bytes, then fetched.

A run pins its source once (`pin`): `models:/NAME@ALIAS` becomes the version the alias named then,
and every file read gets its sha256. The pin is written into the run directory, so a retry
(another attempt, another pod) reads the very same bytes even when the alias moved since, and
logged on the MLflow run, so `trainpipe reproduce` asks for them again (`TrainSpec.pretrained`).
`fetch` puts the directory on this node once, verified file by file against the pin; a local
directory is read where it is, after the same check.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from airflow_trainpipe.config.types import registered_version
from airflow_trainpipe.contracts.train_spec import PretrainedPin as Pinned
from airflow_trainpipe.core.storage import filesystem, is_local, join, local_path, node_scratch_dir, resolve
from airflow_trainpipe.runtime.pretrained.directory import PretrainedDirectory, directory_sha256
from airflow_trainpipe.runtime.pretrained.errors import PretrainedError

PIN_FILE = "pretrained.json"
HF_ARTIFACT = "hf"
"""The name of the Hugging Face directory among a registered model's pyfunc artifacts."""
_COMPLETE = ".trainpipe-complete"


def resolve_source(uri: str) -> str:
    """The source a configured URI reads now: an alias becomes its version's number."""
    if (version := registered_version(uri)) is None:
        return resolve(uri)
    name, number, alias = version
    if number is not None or alias is None:
        return uri
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    _use_tracking_store()
    try:
        number = MlflowClient().get_model_version_by_alias(name, alias).version
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise PretrainedError(
                f"pretrained {uri}: the registry has no version with alias {alias!r} of {name!r}"
            ) from None
        raise  # the server or its store: retried
    return f"models:/{name}/{number}"


def pinned_directory(uri: str, run_dir: str, pinned: Pinned | None = None) -> tuple[Path, Pinned]:
    """Rank 0: the run's pretrained directory on this node and its pin. The pin is `pinned`
    (reproducing a run), else the one an earlier attempt (or another trial of the study: `run_dir`
    is then the study's, TrainSpec.pin_dir) wrote, else made now and written."""
    pin = pinned or read_pin(run_dir)
    if pin is not None:
        return fetch(pin), pin
    source = resolve_source(uri)
    path, digests = _read(source, None)
    read = Pinned(uri=uri, source=source, sha256=directory_sha256(digests), files=digests)
    pin = write_pin(run_dir, read)
    if pin != read:  # another trial of the study pinned first: read what it pinned, or stop
        return fetch(pin), pin
    return path, pin


def fetch(pin: Pinned) -> Path:
    """This node's copy of a pinned directory, every file checked against the pin."""
    path, digests = _read(pin.source, pin)
    if digests != pin.files:
        changed = sorted(
            set(digests) ^ set(pin.files) | {k for k in digests if pin.files.get(k) != digests[k]}
        )
        raise PretrainedError(
            f"pretrained directory {pin.source}: its bytes are not those this run pinned (sha256 "
            f"{pin.sha256}): {', '.join(changed[:5])} differ. A run trains on one set of weights; "
            "start a new run to read the new ones"
        )
    return path


def node_directory(source: str) -> Path:
    """Where `source` is read on this node: a local directory where it is, else this node's copy."""
    return node_scratch_dir(source, "pretrained") if _copied(source) else local_path(source)


def _copied(source: str) -> bool:
    """Whether `source` is read from a copy on this node (S3, the registry), not where it is."""
    return not is_local(source) or registered_version(source) is not None


def _read(source: str, pin: Pinned | None) -> tuple[Path, dict[str, str]]:
    """This node's directory of `source` and each of its files' sha256, hashed once."""
    path = node_directory(source)
    if _copied(source):
        if (downloaded := _node_copy(source, path, pin)) is not None:
            return path, downloaded
    elif not path.is_dir():
        raise PretrainedError(f"pretrained directory {source}: does not exist (or is not a directory)")
    return path, PretrainedDirectory(path, source).file_digests()


def _node_copy(source: str, target: Path, pin: Pinned | None) -> dict[str, str] | None:
    """The directory copied to `target`, under this node's TRAINPIPE_HOME: the digests of what
    was downloaded, or None when a copy already complete with the pinned bytes (a retry on this
    node, another rank) is read again. Without a pin (the first read of a run) it is always
    downloaded: the source may have changed since."""
    marker = target / _COMPLETE
    if pin is not None and marker.is_file() and marker.read_text() == pin.sha256:
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".fetch-", dir=target.parent))
    try:
        if registered_version(source) is not None:
            _download_registered(source, staging)
        else:
            _download(source, staging)
        digests = PretrainedDirectory(staging, source).file_digests()
        (staging / _COMPLETE).write_text(directory_sha256(digests))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return digests


def _download(uri: str, staging: Path) -> None:
    fs, path = filesystem(uri)
    if not fs.isdir(path):
        raise PretrainedError(f"pretrained directory {uri}: does not exist (or is not a directory)")
    for name in fs.ls(path, detail=False):  # the top level only: a model directory is flat
        if fs.isfile(name):
            fs.get_file(name, str(staging / name.rstrip("/").rsplit("/", 1)[-1]))


def _download_registered(source: str, staging: Path) -> None:
    """The Hugging Face directory a registered version carries (its pyfunc's `hf` artifact)."""
    from mlflow.exceptions import MlflowException
    from mlflow.models import Model
    from mlflow.store.artifact.models_artifact_repo import ModelsArtifactRepository

    _use_tracking_store()
    try:
        repository = ModelsArtifactRepository(source)
        with tempfile.TemporaryDirectory() as tmp:
            model = Model.load(repository.download_artifacts("MLmodel", dst_path=tmp))
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise PretrainedError(f"pretrained {source}: the registry has no such version") from None
        raise
    artifacts = (model.flavors.get("python_function") or {}).get("artifacts") or {}
    if HF_ARTIFACT not in artifacts:
        raise PretrainedError(
            f"pretrained {source}: that version has no Hugging Face directory (only pipelines with "
            "training.pretrained register one); fine-tune from a version such a pipeline registered"
        )
    (staging / "_mlflow").mkdir()
    downloaded = Path(
        repository.download_artifacts(artifacts[HF_ARTIFACT]["path"], dst_path=str(staging / "_mlflow"))
    )
    for item in downloaded.iterdir():
        item.rename(staging / item.name)
    shutil.rmtree(staging / "_mlflow")


def _use_tracking_store() -> None:
    """The registry the job's Tracker logs to (it starts later): the environment's, else ours."""
    from airflow_trainpipe.core.tracking_store import use_tracking_uri

    use_tracking_uri()


def read_pin(run_dir: str) -> Pinned | None:
    """The pin an earlier attempt of this run wrote, if any."""
    fs, path = filesystem(join(run_dir, PIN_FILE))
    if not fs.exists(path):
        return None
    return Pinned.model_validate_json(fs.cat_file(path))


def write_pin(run_dir: str, pinned: Pinned) -> Pinned:
    """Write the pin unless one is there already (two trials of a study starting together: the
    first written wins, and both read it back); returns the pin in force."""
    fs, path = filesystem(join(run_dir, PIN_FILE))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if (held := read_pin(run_dir)) is not None:
        return held
    fs.pipe_file(path, json.dumps(pinned.model_dump(mode="json"), indent=1, sort_keys=True).encode())
    return read_pin(run_dir) or pinned
