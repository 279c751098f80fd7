"""MLflow tracking of a training run, from rank 0 only.

A retry of the same Airflow task resumes into the same MLflow run: the run id is kept in the
run directory (and passed by the operator from the task state store when it has one).
"""

from __future__ import annotations

import json
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from airflow_trainpipe import __version__
from airflow_trainpipe.contracts.artifacts import SPEC_ARTIFACT, library_versions
from airflow_trainpipe.contracts.tags import (
    CODE_VERSION_TAG,
    CONFIG_HASH_TAG,
    DATA_DIGEST_TAG,
    HYPERPARAMETER_OVERRIDES_TAG,
    LIBRARIES_TAG,
    PIPELINE_TAG,
    PRETRAINED_SHA256_TAG,
    PRETRAINED_SOURCE_TAG,
    PRETRAINED_URI_TAG,
    RESUMED_FROM_STEP_TAG,
    RUN_ID_TAG,
    THRESHOLD_TAG,
    TRANSFORM_HASH_TAG,
    WORLD_SIZE_TAG,
)
from airflow_trainpipe.contracts.train_spec import PretrainedPin, TrainSpec
from airflow_trainpipe.core.digest import content_digest
from airflow_trainpipe.core.storage import filesystem, join, resolve
from airflow_trainpipe.core.tracking_store import experiment_id_of, use_tracking_uri
from airflow_trainpipe.data.sources import lineage_tags

log = logging.getLogger(__name__)

RUN_ID_FILE = "mlflow_run.json"
METRICS_PER_BATCH = 200  # buffered metrics sent in one log_batch


def flatten(prefix: str, value: Any, out: dict[str, str]) -> dict[str, str]:
    if isinstance(value, dict):
        for key, item in value.items():
            flatten(f"{prefix}.{key}" if prefix else str(key), item, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, list) else str(value)
    return out


class Tracker:
    """Rank 0's MLflow run; every method is cheap to call from the training loop."""

    def __init__(
        self, *, experiment: str, run_dir: str, run_name: str, run_id: str | None, tags: dict[str, str]
    ):
        from mlflow.tracking import MlflowClient

        tracking_uri = use_tracking_uri()
        self.client = MlflowClient()
        self._fs, self._id_path = filesystem(join(run_dir, RUN_ID_FILE))
        run_id = run_id or self._stored_run_id()
        self.resumed = run_id is not None
        if run_id is None:
            experiment_id = experiment_id_of(self.client, experiment, tracking_uri)
            run_id = self.client.create_run(experiment_id, run_name=run_name, tags=tags).info.run_id
            self.experiment_id = experiment_id
            self._fs.makedirs(self._id_path.rsplit("/", 1)[0], exist_ok=True)
            self._fs.pipe_file(self._id_path, json.dumps({"run_id": run_id}).encode())
        else:
            self.client.update_run(run_id, status="RUNNING")
            self.experiment_id = self.client.get_run(run_id).info.experiment_id
            self.run_id = run_id
            self.set_tags(tags)
        self.run_id = run_id
        self._buffer: list[Any] = []
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mlflow-metrics")
        self._pending: Future[Any] | None = None

    def _stored_run_id(self) -> str | None:
        try:
            return json.loads(self._fs.cat_file(self._id_path))["run_id"]
        except FileNotFoundError:
            return None

    def log_params_once(self, params: dict[str, str]) -> None:
        """Log the params the run does not have yet.

        MLflow refuses to change a logged param, so a resumed run keeps the first attempt's values
        (a different world size is recorded as a tag); an attempt that died before logging its
        params has them logged by the next one.
        """
        from mlflow.entities import Param

        existing = self.client.get_run(self.run_id).data.params if self.resumed else {}
        items = [Param(k, v[:6000]) for k, v in sorted(params.items()) if k not in existing]
        for start in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[start : start + 100])

    def log_metrics(self, metrics: dict[str, float], step: int, flush: bool = False) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self._buffer += [Metric(k, float(v), now, step) for k, v in metrics.items()]
        if flush:
            self.flush()
        elif len(self._buffer) >= METRICS_PER_BATCH:
            self._send_in_background()

    def _send_in_background(self) -> None:
        # A batch of 200 metrics into the SQLite store takes ~45 ms, the time of four small-model
        # steps, which the other ranks would wait for at the next all-reduce. One writer thread
        # keeps the batches in order; MLflow's own asynchronous logging (synchronous=False) would
        # write them from a pool of up to ten threads into one SQLite file.
        batch, self._buffer = self._buffer, []
        self._raise_failed_send()
        self._pending = self._writer.submit(self.client.log_batch, self.run_id, metrics=batch)

    def _raise_failed_send(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # the previous batch's error, if it failed, on the training thread

    def flush(self) -> None:
        """Everything logged so far is in the store when this returns."""
        self._raise_failed_send()
        if self._buffer:
            self.client.log_batch(self.run_id, metrics=self._buffer)
            self._buffer = []

    def set_tags(self, tags: dict[str, str]) -> None:
        """In one request (`log_batch`): a job sets some twenty tags, each a round trip to a
        tracking server (or an SQLite transaction) when set one by one."""
        from mlflow.entities import RunTag

        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for start in range(0, len(items), 100):  # MLflow's limit of tags per batch
            self.client.log_batch(self.run_id, tags=items[start : start + 100])

    def log_data_input(self, name: str, source_uri: str, digest: str) -> None:
        from mlflow.data.meta_dataset import MetaDataset
        from mlflow.entities import DatasetInput, InputTag
        from mlflow.exceptions import MlflowException

        dataset = MetaDataset(  # type: ignore[abstract]  # concrete at run time; mlflow's annotations say otherwise
            source=dataset_source(source_uri), name=name, digest=digest.removeprefix("sha256:")[:36]
        )
        context = InputTag(key="mlflow.data.context", value="training")
        inputs = [DatasetInput(dataset._to_mlflow_entity(), tags=[context])]
        try:
            self.client.log_inputs(self.run_id, datasets=inputs)
        except MlflowException as error:
            # MLflow's SQL store looks the experiment's dataset up, then inserts it: a job of the
            # same pipeline logging the same snapshot at that moment (a study's parallel trials,
            # overlapping runs) inserts it in between, and the store's unique key refuses ours
            # (BAD_REQUEST, from SQLite, PostgreSQL or MySQL alike, through a server too). Logging
            # an input is idempotent: the second call finds the winner's row and links this run
            # to it; an error that was not that race is raised by the second call.
            log.info("logging the dataset input again after %s", str(error).splitlines()[0])
            self.client.log_inputs(self.run_id, datasets=inputs)

    def log_model(
        self, model: Any, transform: Any, input_example: Any, hf_directory: Any = None, laps: Any = None
    ) -> str:
        """Log the final model as a pyfunc that takes raw rows; called once, at the end.

        `transform` is the run's FittedTransform, `input_example` a few raw rows (a DataFrame),
        `hf_directory` the model as a Hugging Face directory (a pretrained pipeline's), logged
        among the model's artifacts; `laps` (runtime.startup.Laps) times its steps. Leaving the fluent
        run context ends the run.

        A binary model's decision threshold is read from this run's `trainpipe.threshold`, which the
        final evaluation set before: the register task copies that tag onto the version, so the
        model's threshold and its version's tag are one number, from one string.
        """
        import mlflow

        from airflow_trainpipe.runtime.serving import log_raw_row_model

        tagged = self.client.get_run(self.run_id).data.tags.get(THRESHOLD_TAG)
        threshold = None if tagged is None else float(tagged)
        with mlflow.start_run(run_id=self.run_id, log_system_metrics=False):
            info = log_raw_row_model(
                model, transform, input_example, hf_directory=hf_directory, laps=laps, threshold=threshold
            )
        return info.model_uri

    def log_dict(self, payload: dict[str, Any], artifact_file: str) -> None:
        self.client.log_dict(self.run_id, payload, artifact_file)

    def finish(self, status: str) -> None:
        try:
            self.flush()
        finally:  # a failed metrics batch still ends the run (a failing job's fail() marks it FAILED)
            self.client.set_terminated(self.run_id, status=status)

    def fail(self) -> None:
        """Mark the run FAILED on the way out of a failing job, never hiding the job's own error."""
        try:
            self.finish("FAILED")
        except Exception as exc:  # MLflow itself may be why the job fails
            log.warning("could not mark MLflow run %s FAILED: %s", self.run_id, exc)


def dataset_source(uri: str) -> Any:
    """The MLflow dataset source of a snapshot's URI, its kind named. MLflow registers two source
    classes that read local files; left to choose, it warned "can be interpreted in multiple ways"
    in every job's log. The first registered kind that reads the URI is the one it would pick."""
    from mlflow.data.dataset_source_registry import get_registered_sources, resolve_dataset_source

    kinds = [kind for kind in get_registered_sources() if kind._can_resolve(uri)]
    return resolve_dataset_source(uri, candidate_sources=kinds[:1] or None)


def start_tracking(
    spec: TrainSpec,
    ds_config: dict[str, Any],
    *,
    world_size: int,
    global_batch: int,
    resumed_from: int,
    transform_hash: str,
    pretrained: PretrainedPin | None = None,
) -> Tracker:
    """Rank 0's MLflow run of a job: params (the effective hyperparameters and DeepSpeed config),
    lineage tags, the spec it ran (what `trainpipe reproduce` trains again from), the data input."""
    config = spec.config
    tracker = Tracker(
        experiment=config.pipeline,
        run_dir=spec.run_dir,
        run_name=spec.run_id,
        run_id=spec.mlflow_run_id,
        tags={PIPELINE_TAG: config.pipeline, RUN_ID_TAG: spec.run_id, **spec.tags},
    )
    params = flatten("", config.model_dump(mode="json", by_alias=True), {})
    # What this run trained with: the effective values, form overrides included.
    params.update(flatten("training.hyperparameters", spec.hyperparameters.model_dump(mode="json"), {}))
    params.update(flatten("deepspeed_config", ds_config, {}))
    params.update(
        {
            "world_size": str(world_size),
            "global_batch": str(global_batch),
            "data_files": str(len(spec.data_files)),
        }
    )
    tracker.log_params_once(params)
    digest = spec.data_digest or content_digest(spec.data_files)
    tracker.set_tags(
        {
            DATA_DIGEST_TAG: digest,
            WORLD_SIZE_TAG: str(world_size),
            RESUMED_FROM_STEP_TAG: str(resumed_from),
            CONFIG_HASH_TAG: config.content_hash,
            CODE_VERSION_TAG: __version__,
            TRANSFORM_HASH_TAG: transform_hash,
            HYPERPARAMETER_OVERRIDES_TAG: json.dumps(spec.overrides, sort_keys=True),
            LIBRARIES_TAG: json.dumps(library_versions(), sort_keys=True),
            **(lineage_tags(spec.manifest) if spec.manifest is not None else {}),
            **(
                {
                    PRETRAINED_URI_TAG: pretrained.uri,
                    PRETRAINED_SOURCE_TAG: pretrained.source,
                    PRETRAINED_SHA256_TAG: pretrained.sha256,
                }
                if pretrained is not None
                else {}
            ),
        }
    )
    # With the pin: `trainpipe reproduce` reads the very bytes, even after an alias moved.
    logged = spec.model_copy(update={"pretrained": pretrained}) if pretrained is not None else spec
    tracker.log_dict(json.loads(logged.to_json()), SPEC_ARTIFACT)
    windowed = spec.manifest is not None and spec.manifest.window
    source = resolve(config.data.uri) if windowed else spec.data_files[0].rsplit("/", 1)[0]
    tracker.log_data_input(f"{config.pipeline}-snapshot", source, digest)
    return tracker
