"""`trainpipe reproduce`: train a registered model version again from what its run logged, and
say whether the very same model came out.

Every training job logs `spec.json` on its MLflow run: the validated config, exactly the data files
with the manifest of their bytes, and the effective hyperparameters (form overrides included);
its tags record the code version, the world size and the library versions (`trainpipe.libraries`).
Reproducing is that spec trained again under a new run id on the same world size, with the
local launcher. The job checks every file's bytes against the manifest before training, so
changed data stops it (naming the file) rather than producing a different model. The comparison
is of every holdout metric, the candidate's final evaluation and the weights' sha256: equal
weights mean the same model bit for bit, and anything else is listed with its likely causes.

mlflow is imported inside the functions; the module is light, imported by the training job too.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow_trainpipe.contracts.artifacts import RESULT_ARTIFACT, SPEC_ARTIFACT, library_versions
from airflow_trainpipe.contracts.tags import CODE_VERSION_TAG, LAUNCHED_BY_TAG, LIBRARIES_TAG, REPRODUCES_TAG
from airflow_trainpipe.registry.reads import RegistryError

if TYPE_CHECKING:
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.hooks.mlflow import MlflowHook


@dataclass(frozen=True)
class Logged:
    """What a registered version's run logged: enough to train it again and to compare."""

    model_name: str
    version: str
    run_id: str
    spec: dict[str, Any]
    result: dict[str, Any]
    tags: dict[str, str]


def parse_reference(reference: str) -> tuple[str, str | None, str | None]:
    """`name@alias` or `name/version` -> (name, alias, version)."""
    if "@" in reference:
        name, alias = reference.rsplit("@", 1)
        if name and alias:
            return name, alias, None
    elif "/" in reference:
        name, number = reference.rsplit("/", 1)
        if name and number.isdigit():
            return name, None, number
    raise RegistryError(f"expected MODEL@ALIAS or MODEL/VERSION, got {reference!r}")


def logged_version(hook: MlflowHook, reference: str) -> Logged:
    from mlflow.exceptions import MlflowException

    name, alias, number = parse_reference(reference)
    with hook.activated(), tempfile.TemporaryDirectory(prefix="trainpipe-reproduce-") as directory:
        client = hook.get_conn()
        try:
            if alias is not None:
                found = client.get_model_version_by_alias(name, alias)
            else:
                found = client.get_model_version(name, str(number))
            run = client.get_run(str(found.run_id))
        except MlflowException as exc:
            raise RegistryError(f"cannot find {reference} in the MLflow registry: {exc.message}") from exc
        documents = {}
        for artifact in (SPEC_ARTIFACT, RESULT_ARTIFACT):
            try:
                documents[artifact] = json.loads(
                    Path(client.download_artifacts(run.info.run_id, artifact, directory)).read_text()
                )
            except (MlflowException, OSError) as exc:
                raise RegistryError(
                    f"{name} version {found.version}'s run {run.info.run_id} has no {artifact} (deleted "
                    "from its artifacts, or trained before runs logged what reproducing needs): it "
                    "cannot be reproduced"
                ) from exc
            except ValueError as exc:  # not JSON
                raise RegistryError(
                    f"{name} version {found.version}'s run {run.info.run_id} has an unreadable {artifact} "
                    f"({exc}): it cannot be reproduced"
                ) from exc
    return Logged(
        name,
        str(found.version),
        run.info.run_id,
        documents[SPEC_ARTIFACT],
        documents[RESULT_ARTIFACT],
        dict(run.data.tags),
    )


def reproduction_spec(logged: Logged, run_id: str) -> TrainSpec:
    """The logged spec under a new run id (a fresh run directory and MLflow run), tagged with
    what it reproduces."""
    from pydantic import ValidationError

    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.core.storage import filesystem

    try:
        spec = TrainSpec.model_validate(logged.spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RegistryError(
            f"{logged.model_name} version {logged.version}'s logged spec.json does not load in this "
            f"version of airflow-trainpipe ({exc.error_count()} problem(s); {where}: {first['msg']}): "
            "reproduce it with the version it was trained with"
        ) from None
    # Before a job starts: a deleted file ends the reproduction, whatever a retry would do.
    for uri in spec.data_files:
        try:
            fs, path = filesystem(uri)
            exists = fs.exists(path)
        except Exception:  # storage not reachable from here: the job reads it, and says why not
            break
        if not exists:
            raise RegistryError(
                f"{logged.model_name} version {logged.version} trained on {uri}, which no longer exists "
                "(deleted by hand, a snapshots gc, or a table's vacuum or expiry): it cannot be reproduced"
            )
    tags = {
        **spec.tags,
        REPRODUCES_TAG: f"{logged.model_name}/{logged.version}",
        LAUNCHED_BY_TAG: "reproduce",
    }
    return spec.model_copy(update={"run_id": run_id, "mlflow_run_id": None, "tags": tags})


@dataclass
class Comparison:
    rows: list[tuple[str, Any, Any]] = field(default_factory=list)
    """(what, logged, reproduced) for the weights and every metric."""

    causes: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return all(_same(a, b) for _, a, b in self.rows)

    def table(self) -> str:
        width = max(len(name) for name, _, _ in self.rows)
        lines = [f"{'':{width}}  {'logged':>22}  {'reproduced':>22}"]
        for name, logged, reproduced in self.rows:
            mark = "" if _same(logged, reproduced) else "  <- differs"
            lines.append(f"{name:{width}}  {_shown(logged):>22}  {_shown(reproduced):>22}{mark}")
        return "\n".join(lines)


def compare(logged: Logged, reproduced: dict[str, Any]) -> Comparison:
    result = logged.result
    comparison = Comparison([("weights sha256", result["weights_sha256"], reproduced["weights_sha256"])])
    sections = (
        ("holdout", result["holdout_metrics"], reproduced["holdout_metrics"]),
        ("final", result["evaluation"]["candidate"], reproduced["evaluation"]["candidate"]),
    )
    for label, before, after in sections:
        for name in sorted(set(before) | set(after)):
            comparison.rows.append((f"{label} {name}", before.get(name), after.get(name)))
    if not comparison.identical:
        comparison.causes = likely_causes(logged, reproduced)
    return comparison


def likely_causes(logged: Logged, reproduced: dict[str, Any]) -> list[str]:
    from airflow_trainpipe import __version__

    causes = []
    code = logged.tags.get(CODE_VERSION_TAG)
    if code != __version__:
        causes.append(f"code version: trained with airflow-trainpipe {code}, reproduced with {__version__}")
    if int(logged.result.get("world_size", 0)) != int(reproduced.get("world_size", 0)):
        causes.append(
            f"world size: {logged.result.get('world_size')} then, {reproduced.get('world_size')} now"
        )
    then = json.loads(logged.tags.get(LIBRARIES_TAG, "{}"))
    now = library_versions()
    changed = [f"{k} {then.get(k)} -> {now[k]}" for k in now if then.get(k) not in (None, now[k])]
    if changed:
        causes.append("library versions: " + ", ".join(changed))
    if not then:
        causes.append("library versions: not recorded by the original run")
    if logged.result.get("resumed_from_step"):
        causes.append(
            f"the original run resumed from step {logged.result['resumed_from_step']} (a resume on another world size is not bit-exact)"
        )
    if logged.result.get("compute_hours_gpu"):
        causes.append("the original run trained on GPUs; this reproduction ran on this machine's devices")
    return causes or ["none recorded: non-deterministic kernels or hardware are left"]


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)  # NaN equals NaN here: both runs computed "undefined"
    return bool(a == b)


def _shown(value: Any) -> str:
    if isinstance(value, str) and len(value) > 22:
        return value[:19] + "..."
    return f"{value:.10g}" if isinstance(value, float) else str(value)
