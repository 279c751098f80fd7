"""DistributedTrainOperator: the `train` task, a DeepSpeed job launched with torchrun.

`launcher: local` (the embedded default) runs torchrun as a child of the Airflow worker;
`launcher: kubernetes` runs the same command in a KubernetesPodOperator pod (one node) or an
Indexed Job with a headless Service (several nodes). A retry of the task resumes from the run's
newest complete checkpoint; `task_state_store` carries the MLflow run id and the checkpoint
pointer from one try to the next.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import MlflowRunLink
from airflow_trainpipe.openlineage.reporting import OpenLineageReporting

if TYPE_CHECKING:
    from airflow.sdk import Context, XComArg

    from airflow_trainpipe.config.training import Hyperparameters
    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.contracts.payloads import TrainResult
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.launchers.local import LocalLauncher
    from airflow_trainpipe.launchers.watcher import JobWatcher
    from airflow_trainpipe.tuning.outcomes import TuningSummary


class DistributedTrainOperator(TrainpipeRetryPolicyMixin, OpenLineageReporting, BaseOperator):
    """Train the pipeline's model; returns the job's TrainResult (contracts/payloads.py) as XCom.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param run_id: scopes checkpoints (`<checkpoint.uri>/<pipeline>/<run_id>/`) and the MLflow run.
    :param partition: sub-path of the run's snapshot; defaults to `data.partition` (templated).
    :param validation: the validate task's ValidationSummary (e.g. `validate.output`): the job
        trains on exactly its manifest's files, checked byte for byte.
    :param data_files: without `validation`: exact files to train on; default: the files of a
        snapshot resolved from `<data.uri>/<partition>/` now.
    :param data_digest: with `data_files`: the digest of their stored, validated manifest.
    :param hyperparameter_overrides: per-run overrides of `training.hyperparameters` (trigger form).
    :param max_steps: stop after this many optimizer steps.
    :param nproc: processes per node; default `training.resources` (2 in the CPU example).
    :param env: extra environment for the job (never put secrets here; use connections).
    :param mlflow_conn_id: `mlflow` connection the job logs to; its URI and credentials reach the
        job as environment variables. Undefined `mlflow_default`: the embedded sqlite store.
    :param tuned: the `tune` task's TuningSummary (templated; JSON `null` or empty: no study ran).
        Its best trial's model becomes this task's result, or, with `tuning.retrain`, its
        hyperparameters are trained once more on every training row.
    """

    template_fields: Sequence[str] = (
        "run_id",
        "partition",
        "validation",
        "data_files",
        "data_digest",
        "hyperparameter_overrides",
        "tuned",
    )
    template_fields_renderers = {
        "validation": "json",
        "data_files": "json",
        "hyperparameter_overrides": "json",
    }
    ui_color = "#e8d5f5"
    operator_extra_links = (MlflowRunLink(),)

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        run_id: str = "{{ run_id }}",
        partition: str | None = None,
        validation: dict[str, Any] | XComArg | None = None,
        data_files: list[str] | str | None = None,
        data_digest: str | None = None,
        hyperparameter_overrides: dict[str, Any] | str | None = None,
        max_steps: int | None = None,
        nproc: int | None = None,
        env: dict[str, str] | None = None,
        mlflow_conn_id: str | None = "mlflow_default",
        tuned: dict[str, Any] | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.tuned = tuned
        self.run_id = run_id
        self.partition = partition if partition is not None else self.config.data.partition
        self.validation = validation
        self.data_files = data_files
        self.data_digest = data_digest
        self.hyperparameter_overrides = hyperparameter_overrides or {}
        self.max_steps = max_steps
        self.nproc = nproc
        self.env = env or {}
        self.mlflow_conn_id = mlflow_conn_id
        # What OpenLineage is told (openlineage/lineage.training): the snapshot in, the model out.
        self._lineage_manifest: Manifest | None = None
        self._lineage_result: TrainResult | None = None
        self._lineage_tracking_uri = ""
        self._launcher: LocalLauncher | None = None
        self._k8s_operator: Any = None  # the KubernetesPodOperator / KubernetesJobOperator of this try
        self._secret_env: dict[str, str] = {}  # put in the try's Secret beside connection credentials
        self._jobs_on_host = 1  # local jobs that share this worker's cores (trials side by side)

    # -- what to run ----------------------------------------------------------------------------

    def _spec(self, store: Any, context: Context, retrain: TuningSummary | None = None) -> TrainSpec:
        from airflow_trainpipe.contracts.train_spec import TrainSpec

        manifest = self._manifest(context)
        if manifest is not None:
            self.log.info(
                "snapshot %s: %d file(s), %d rows", manifest.digest, len(manifest.files), manifest.rows
            )
        files = manifest.file_uris if manifest is not None else self._given_files()
        self._lineage_manifest = manifest
        return TrainSpec(
            config=self.config,
            run_id=self.run_id,
            data_files=files,
            data_digest=manifest.digest if manifest is not None else None,
            manifest=manifest,
            hyperparameters=self._hyperparameters(retrain),
            mlflow_run_id=store.get("mlflow_run_id") if store is not None else None,
            tags={"airflow.dag_id": self.dag_id, "airflow.task_id": self.task_id},
        )

    def _given_files(self) -> list[str]:
        files = self.data_files
        return [files] if isinstance(files, str) else list(files or [])  # a template may render one path

    def _manifest(self, context: Context) -> Manifest | None:
        """The snapshot the job must read: the validated one, or the partition's (the window's)
        as it is now.

        Files given without a digest (a hand-written task) train unverified, as given.
        """
        from airflow_trainpipe.contracts.payloads import ValidationSummary, read_payload
        from airflow_trainpipe.data.freeze import freeze_run
        from airflow_trainpipe.data.snapshots.manifests import load_manifest

        files, digest = self._given_files(), self.data_digest
        if self.validation is not None:
            return read_payload(ValidationSummary, self.validation, "validation").manifest
        if not files:
            return freeze_run(self.config, context, self.partition, self.render_template)
        if digest is None:
            return None
        manifest = load_manifest(self.config.data, digest)
        if manifest.file_uris != files:
            raise AirflowFailException(
                f"data_files are not the files of the validated snapshot {digest} "
                f"({len(files)} given, {len(manifest.files)} in its manifest)"
            )
        return manifest

    def _hyperparameters(self, retrain: TuningSummary | None = None) -> Hyperparameters:
        """The config's, with this run's overrides and step limit: validated once, here. With
        `retrain` (a study and `tuning.retrain`): its best trial's values win over the form's."""
        from pydantic import ValidationError

        form = self._overrides()
        overrides = {**form, **(self._best_trials(retrain, form) if retrain is not None else {})}
        if overrides:
            self.log.info("hyperparameters overridden for this run: %s", overrides)
        try:
            return self.config.training.hyperparameters.with_overrides(overrides, max_steps=self.max_steps)
        except ValidationError as exc:
            raise AirflowFailException(f"invalid max_steps {self.max_steps}: {exc}") from exc

    def _overrides(self) -> dict[str, Any]:
        """The rendered overrides that change something, validated against the config's types.

        A template renders to text: JSON (`| tojson`, what the factory's trigger form uses) or a
        Python literal (a dict rendered without native templating) are both accepted. Values
        equal to the config are dropped, so a form submitted unchanged is not an override.
        """
        from pydantic import ValidationError

        raw = _mapping(self.hyperparameter_overrides)
        current = self.config.training.hyperparameters
        try:
            merged = current.with_overrides(raw)
        except ValidationError as exc:
            raise AirflowFailException(f"invalid hyperparameter_overrides {raw}: {exc}") from exc
        return {
            name: getattr(merged, name) for name in raw if getattr(merged, name) != getattr(current, name)
        }

    def _tuning_summary(self) -> TuningSummary | None:
        from airflow_trainpipe.contracts.payloads import read_payload
        from airflow_trainpipe.tuning.outcomes import TuningSummary

        raw = self.tuned
        if isinstance(raw, str):
            raw = _mapping(raw) if raw.strip() not in ("", "null", "None") else None
        return read_payload(TuningSummary, raw, "the XCom of task tune") if raw else None

    def _best_trials(self, summary: TuningSummary, form: dict[str, Any]) -> dict[str, Any]:
        """The study's best hyperparameters, as overrides of the config with the form's applied."""
        from airflow_trainpipe.tuning.study import as_overrides

        self.log.info(
            "retraining with the best trial's (%s) hyperparameters %s",
            summary.best_trial,
            summary.best_params,
        )
        return as_overrides(self.config.training.hyperparameters.with_overrides(form), summary.best_params)

    def _adopt(self, context: Context, summary: TuningSummary) -> dict[str, Any]:
        """The best trial's full-budget model is the candidate: no second training."""
        from airflow_trainpipe.hooks.mlflow import MlflowHook

        result = summary.candidate
        if result is None:  # the tune task fails first
            raise AirflowFailException(f"study {summary.study_name} has no completed trial")
        self.log.info(
            "the candidate is trial %s of study %s (%s %s = %s on the validation split) with %s; MLflow run %s",
            summary.best_trial, summary.study_name, summary.direction, summary.metric, summary.best,
            summary.best_params, result.mlflow_run_id,
        )  # fmt: skip
        hook = MlflowHook(self.mlflow_conn_id)
        MlflowRunLink.persist(context, hook.run_url(result.mlflow_experiment_id, result.mlflow_run_id))
        self._lineage_result, self._lineage_tracking_uri = result, hook.tracking_uri
        return result.to_xcom()

    # -- running it -----------------------------------------------------------------------------

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.launchers.watcher import JobWatcher

        summary = self._tuning_summary()
        if summary is not None and not (self.config.tuning is not None and self.config.tuning.retrain):
            return self._adopt(context, summary)
        store = context.get("task_state_store")
        try_number = context["ti"].try_number
        spec = self._spec(store, context, retrain=summary)
        previous: Any = store.get("checkpoint") if store is not None else None
        if previous:
            self.log.info(
                "try %d: the previous try's last complete checkpoint is step %s at %s; resuming from the newest complete one",
                try_number,
                previous["step"],
                previous["uri"],
            )
        watcher = JobWatcher(store)
        hook = MlflowHook(self.mlflow_conn_id)
        self._lineage_tracking_uri = hook.tracking_uri
        if self.config.training.launcher == "kubernetes":
            result = self._run_on_kubernetes(context, spec, watcher, try_number)
        else:
            result = self._run_locally(spec, watcher, hook, try_number)
        self._lineage_result = result
        MlflowRunLink.persist(context, hook.run_url(result.mlflow_experiment_id, result.mlflow_run_id))
        return result.model_copy(update={"run_dir": spec.run_dir}).to_xcom()

    def _openlineage(self) -> Any:
        from airflow_trainpipe.openlineage import lineage

        return lineage.training(
            self.config, self._lineage_manifest, self._lineage_result, self._lineage_tracking_uri
        )

    def _run_locally(self, spec: TrainSpec, watcher: JobWatcher, hook: Any, try_number: int) -> TrainResult:
        from airflow_trainpipe.config.secrets import redact_uri
        from airflow_trainpipe.launchers.local import LocalLauncher

        nproc = self.nproc or self.config.training.resources.nproc_per_node
        self.log.info("starting torchrun with %d process(es); run directory %s", nproc, spec.run_dir)
        self.log.info("MLflow tracking URI %s", redact_uri(hook.tracking_uri))
        # Credentials travel as environment only: never on the command line or in the spec file.
        env = {**self.env, **hook.environment(), "TRAINPIPE_TRY_NUMBER": str(try_number)}
        launcher = self._launcher = LocalLauncher(spec, nproc, env=env, jobs_on_host=self._jobs_on_host)
        launcher.start()
        try:
            for line in launcher.lines():
                if (shown := watcher.feed(line.text)) is not None:
                    self.log.info("%s", shown)
            code = launcher.wait()
        finally:
            launcher.kill()  # timeouts and exceptions land here: no rank outlives the task
        if code != 0:
            if run_id := watcher.mlflow_run_id or spec.mlflow_run_id:
                _mark_run_failed(hook, run_id, self.log)  # a job killed hard could not do it itself
            raise watcher.failure(
                f"training job exited with code {code} (try {try_number})",
                f"a retry resumes from the newest complete checkpoint under {spec.run_dir}/checkpoints",
            )
        if watcher.result is None:
            raise AirflowException("training job exited 0 without reporting a result")
        return watcher.result

    def kubernetes_operator(
        self, context: Context, spec: TrainSpec, watcher: JobWatcher | None = None
    ) -> Any:
        """The KubernetesPodOperator (one node) or KubernetesJobOperator (several) of this try."""
        from airflow_trainpipe.launchers import kubernetes_cluster as cluster
        from airflow_trainpipe.launchers.watcher import JobWatcher

        watcher = watcher or JobWatcher()

        labels = self._labels(context, spec, context["ti"].try_number)
        build = cluster.pod_operator if self.config.training.resources.nodes == 1 else cluster.job_operator
        return build(spec, labels, self.task_id, watcher)

    def _run_on_kubernetes(
        self, context: Context, spec: TrainSpec, watcher: JobWatcher, try_number: int
    ) -> TrainResult:
        from airflow_trainpipe.launchers import kubernetes_cluster as cluster

        operator = self._k8s_operator = self.kubernetes_operator(context, spec, watcher)
        resources = self.config.training.resources
        self.log.info(
            "starting %d pod(s) x %d process(es) on Kubernetes; run directory %s",
            resources.nodes,
            resources.nproc_per_node,
            spec.run_dir,
        )
        labels = self._labels(context, spec, try_number)
        try:
            run = cluster.run_pod if resources.nodes == 1 else cluster.run_job
            run(operator, self.config, labels, context, self.log, self._secret_env)
        except Exception as exc:
            raise watcher.failure(
                f"training on Kubernetes failed (try {try_number})",
                "a retry starts new pods that resume "
                f"from the newest complete checkpoint under {spec.run_dir}/checkpoints",
                cause=exc,
            ) from exc
        return watcher.result if watcher.result is not None else _stored_result(spec.run_dir)

    def _labels(self, context: Context, spec: TrainSpec, try_number: int) -> Any:
        """Who the pods belong to. The mapped task instances of tuning trials share their task id:
        the trial's run id and budget make each one's name its own."""
        from airflow_trainpipe.launchers.kubernetes_manifests import RunLabels

        run = context["run_id"]
        if spec.trial is not None:
            hp = spec.hyperparameters
            run = f"{spec.run_id}.e{hp.epochs}s{hp.max_steps or 0}"
        return RunLabels(self.dag_id, self.task_id, run, try_number)

    def on_kill(self) -> None:
        if self._k8s_operator is not None:
            self._k8s_operator.on_kill()  # deletes the pod / the Job (and with it the Service)
            return
        if self._launcher is None:
            return
        # SIGTERM: every rank finishes its step and checkpoints it (the next try recomputes
        # nothing); SIGKILL whatever is left once the configured grace is over.
        self._launcher.stop(self.config.training.checkpoint.termination_grace_s)


def _mapping(raw: Any) -> dict[str, Any]:
    """Rendered overrides as a mapping: JSON text, a Python literal, or a dict already."""
    import ast
    import json

    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except ValueError:
            try:
                raw = ast.literal_eval(raw)
            except (ValueError, SyntaxError):
                raise AirflowFailException(
                    f"hyperparameter_overrides is neither JSON nor a literal: {raw!r}"
                ) from None
    if not isinstance(raw, dict):
        raise AirflowFailException(f"hyperparameter_overrides must be a mapping, got {raw!r}")
    return raw


def _mark_run_failed(hook: Any, run_id: str, log: Any) -> None:
    try:
        hook.mark_run_failed(run_id)
    except Exception as exc:  # the job's failure is what the task reports, not this
        log.warning("could not mark MLflow run %s FAILED: %s", run_id, exc)


def _stored_result(run_dir: str) -> TrainResult:
    """The job's result.json, when the followed log did not carry the result event (a worker
    that reattached after the pod finished)."""
    import json

    from airflow_trainpipe.contracts.artifacts import RESULT_ARTIFACT
    from airflow_trainpipe.contracts.payloads import TrainResult, read_payload
    from airflow_trainpipe.core.storage import filesystem, join

    fs, path = filesystem(join(run_dir, RESULT_ARTIFACT))
    try:
        text = fs.cat_file(path)
    except FileNotFoundError as exc:
        raise AirflowException(
            f"the training pods finished but {run_dir}/result.json does not exist"
        ) from exc
    return read_payload(TrainResult, json.loads(text), f"{run_dir}/result.json")
