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
from airflow.sdk.exceptions import AirflowFailException

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
    from airflow_trainpipe.launchers.runner import Placement, TrainingJob
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
        self._job: TrainingJob | None = None  # this try's, for on_kill
        self._jobs_on_host = 1  # local jobs that share this worker's cores (trials side by side)

    # -- what to run ----------------------------------------------------------------------------

    def _spec(self, store: Any, context: Context, retrain: TuningSummary | None = None) -> TrainSpec:
        from airflow_trainpipe.contracts.train_spec import TrainSpec

        manifest = self._manifest(context)
        if manifest is not None:
            self.log.info(
                "snapshot %s: %d file(s), %d rows", manifest.digest, len(manifest.files), manifest.rows
            )
        self._lineage_manifest = manifest
        return TrainSpec.from_manifest(
            self.config,
            self.run_id,
            manifest,
            self._given_files(),
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
        if manifest.file_uris != files:  # the one check: the spec takes its files from the manifest
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
        hook = MlflowHook(self.mlflow_conn_id)
        self._lineage_tracking_uri = hook.tracking_uri
        result = self._run(context, spec, hook, store)
        self._lineage_result = result
        MlflowRunLink.persist(context, hook.run_url(result.mlflow_experiment_id, result.mlflow_run_id))
        return result.to_xcom()

    def _openlineage(self) -> Any:
        from airflow_trainpipe.openlineage import lineage

        return lineage.training(
            self.config, self._lineage_manifest, self._lineage_result, self._lineage_tracking_uri
        )

    def placement(
        self,
        context: Context,
        hook: Any,
        extra_env: dict[str, str] | None = None,
        secret_env: dict[str, str] | None = None,
    ) -> Placement:
        """Where this try's job runs: here under torchrun (forked from a warm parent when
        TRAINPIPE_FORK_LOCAL_JOBS is set: launchers/forked.py), or in pods (`training.launcher`).
        Credentials travel as environment only: never on a command line or in the spec file."""
        from airflow_trainpipe.launchers.forked import forks_local_jobs
        from airflow_trainpipe.launchers.runner import Placement, Pods

        pods = None
        if self.config.training.launcher == "kubernetes":
            pods = Pods(
                context=context, task_id=self.task_id, log=self.log, dag_id=self.dag_id,
                airflow_run_id=context["run_id"], secret_env=secret_env or {},
            )  # fmt: skip
        return Placement(
            nproc=self.nproc, env={**self.env, **hook.environment(), **(extra_env or {})}, jobs_on_host=self._jobs_on_host,
            pods=pods, try_number=context["ti"].try_number, fork=forks_local_jobs(),
        )  # fmt: skip

    def _run(self, context: Context, spec: TrainSpec, hook: Any, store: Any, **placed: Any) -> TrainResult:
        """This try's job to its end (launchers/runner.py); a failed one's MLflow run is marked
        FAILED here, as a job killed hard could not do it itself."""
        from airflow_trainpipe.config.secrets import redact_uri
        from airflow_trainpipe.core.exceptions import TrainingJobError
        from airflow_trainpipe.launchers.runner import TrainingJob

        job = self._job = TrainingJob(spec, self.placement(context, hook, **placed), store)
        if job.placement.pods is None:
            how = "forking torchrun's agent from the warm parent" if job.forked() else "starting torchrun"
            self.log.info("%s with %d process(es); run directory %s", how, job.nproc, spec.run_dir)
            self.log.info("MLflow tracking URI %s", redact_uri(hook.tracking_uri))
        try:
            return job.run(on_line=lambda text: self.log.info("%s", text))
        except TrainingJobError:
            if job.placement.pods is None and (run_id := job.watcher.mlflow_run_id or spec.mlflow_run_id):
                _mark_run_failed(hook, run_id, self.log)
            raise

    def kubernetes_operator(self, context: Context, spec: TrainSpec) -> Any:
        """The KubernetesPodOperator (one node) or KubernetesJobOperator (several) of this try."""
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.launchers.runner import TrainingJob

        placement = self.placement(context, MlflowHook(self.mlflow_conn_id))
        assert placement.pods is not None, "launcher: kubernetes"
        return TrainingJob(spec, placement).pod_operator(placement.pods)

    def on_kill(self) -> None:
        # Pods: the provider's on_kill deletes them. Here: SIGTERM, every rank finishes its step
        # and checkpoints it (the next try recomputes nothing); SIGKILL what is left after the grace.
        if self._job is not None:
            self._job.stop(self.config.training.checkpoint.termination_grace_s)


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
