"""The tuning tasks: tune_start -> trial (mapped, one task instance per trial) -> tune.

    tune_start   opens the run's Optuna study (RDB storage) and its MLflow parent run;
    trial[i]     runs trial i as one training job with the train task's own launcher (local
                 torchrun or Kubernetes): the job reports each rung to the study and stops itself
                 when pruned; a retry's job resumes from the trial's checkpoint;
    tune         summarises the study from its storage, logs the plots, hands the best trial on.

The `train` task then adopts the best trial's model as the candidate (or retrains with its
hyperparameters when `tuning.retrain`), so the gate and register are the same as without tuning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.contracts.tags import AIRFLOW_DAG_ID_TAG, PIPELINE_TAG
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import MlflowRunLink
from airflow_trainpipe.operators.train import DistributedTrainOperator

if TYPE_CHECKING:
    from airflow.sdk import Context, XComArg

    from airflow_trainpipe.contracts.payloads import TrainResult
    from airflow_trainpipe.contracts.train_spec import TrainSpec
    from airflow_trainpipe.tuning.outcomes import StudyRef


def _storage_url(config: PipelineConfig) -> str:
    from airflow_trainpipe.tuning.study import storage_url

    assert config.tuning is not None
    conn_id = config.tuning.storage_conn_id
    return storage_url(config, BaseHook.get_connection(conn_id).get_uri() if conn_id else None)


def _study_ref(raw: Any) -> StudyRef:
    from airflow_trainpipe.contracts.payloads import read_payload
    from airflow_trainpipe.tuning.outcomes import StudyRef

    return read_payload(StudyRef, raw, "the XCom of task tune_start")


class TuningStartOperator(TrainpipeRetryPolicyMixin, BaseOperator):
    """Open the run's study and its MLflow parent run; skipped (with every trial) when the trigger
    form's `tune` is off.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param run_id: names the study (`<pipeline>:<run_id>`) and scopes the trials' run directories.
    :param enabled: templated; "False" skips tuning for this run.
    :param mlflow_conn_id: the `mlflow` connection of the parent run (undefined: embedded store).
    """

    template_fields: Sequence[str] = ("run_id", "enabled")
    ui_color = "#f5e6d5"

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        run_id: str = "{{ run_id }}",
        enabled: bool | str = True,
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.run_id = run_id
        self.enabled = enabled
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.config.secrets import redact_uri
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.tuning.outcomes import StudyRef
        from airflow_trainpipe.tuning.report import start_parent_run
        from airflow_trainpipe.tuning.study import open_study, study_name

        if str(self.enabled).strip().lower() in ("false", "0", "no", "off", "none"):
            raise AirflowSkipException(
                "tuning is off for this run (the trigger form's `tune`): train trains once"
            )
        name, url = study_name(self.config.pipeline, self.run_id), _storage_url(self.config)
        study = open_study(self.config, name, url)
        finished = sum(t.state.is_finished() for t in study.get_trials(deepcopy=False))
        self.log.info("study %s in %s: %d trial(s) already finished", name, redact_uri(url), finished)
        hook = MlflowHook(self.mlflow_conn_id)
        with hook.activated():
            parent = start_parent_run(
                hook.get_conn(),
                self.config.pipeline,
                name,
                {AIRFLOW_DAG_ID_TAG: self.dag_id, PIPELINE_TAG: self.config.pipeline},
                hook.tracking_uri,
            )
        return StudyRef(
            study_name=name, storage=redact_uri(url), parent_run_id=parent, run_id=self.run_id
        ).to_xcom()


class TuningTrialOperator(DistributedTrainOperator):
    """One trial of the study (a mapped task instance per `slot`): one job through its rungs.

    A retry of the task continues the slot's trial from its newest complete checkpoint; a task
    instance that runs again after its trial ended (a cleared DAG run) returns the stored outcome.

    :param study: tune_start's StudyRef (e.g. `tune_start.output`).
    :param slot: this trial's index in the study's budget (the map index).
    Every other parameter is DistributedTrainOperator's: the trials run its launcher.
    """

    template_fields: Sequence[str] = (*DistributedTrainOperator.template_fields, "study")
    ui_color = "#ead5f5"

    def __init__(self, *, study: dict[str, Any] | XComArg, slot: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.study = study
        self.slot = slot
        if self.config.tuning is not None:
            self.nproc = self.nproc or self.config.trial_nproc_per_node
            # The grid runs up to max_parallel trials at once; on one worker they share its cores.
            self._jobs_on_host = self.config.tuning.budget.max_parallel

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.tuning.report import tag_trial_run
        from airflow_trainpipe.tuning.study import open_study
        from airflow_trainpipe.tuning.trials import run_trial

        ref = _study_ref(self.study)
        ti = context["ti"]
        base = self._spec(None, context)
        url = _storage_url(self.config)
        study = open_study(self.config, ref.study_name, url)
        hook = MlflowHook(self.mlflow_conn_id)
        self._lineage_tracking_uri = hook.tracking_uri
        # The last try tells the study the trial failed; an earlier one leaves it running for the retry.
        outcome = run_trial(
            self.config, study, ref, self.slot, base, TrialJobs(self, context, hook, url),
            last_attempt=ti.try_number > ti.max_tries,
        )  # fmt: skip
        with hook.activated():
            client = hook.get_conn()
            tag_trial_run(client, outcome)
            if outcome.mlflow_run_id is not None:  # the grid's "MLflow run" button of this trial
                run = client.get_run(outcome.mlflow_run_id)
                MlflowRunLink.persist(context, hook.run_url(run.info.experiment_id, run.info.run_id))
        return outcome.to_xcom()


class TrialJobs:
    """A trial's jobs, one per rung (tuning/trials.py calls it with each rung's spec), run as the
    train task runs its job (launchers/runner.py). The study's URL, with its password, reaches the
    job as the environment of a local job or in the try's Secret for pods, never in the spec."""

    def __init__(self, task: TuningTrialOperator, context: Context, hook: Any, study_url: str):
        self.task, self.context, self.hook, self.study_url = task, context, hook, study_url

    def __call__(self, spec: TrainSpec) -> TrainResult:
        from airflow_trainpipe.runtime.rungs import STORAGE_ENV

        # Pods reference the Secret only when their job has rungs to report (kubernetes_manifests).
        rungs = spec.trial is not None and bool(spec.trial.rungs)
        # No task_state_store: the trial's run directory, not the task's state, carries the resume.
        result = self.task._run(
            self.context, spec, self.hook, None,
            extra_env={STORAGE_ENV: self.study_url}, secret_env={STORAGE_ENV: self.study_url} if rungs else {},
        )  # fmt: skip
        self.task._lineage_result = result  # the trial's last rung: a model only at the full budget
        return result


class TuningResultOperator(TrainpipeRetryPolicyMixin, BaseOperator):
    """The study's summary and its best trial, read from the study's storage; fails when no
    trial completed. Runs when every trial has ended and at least one succeeded.

    :param study: tune_start's StudyRef.
    """

    template_fields: Sequence[str] = ("study",)
    ui_color = "#f5e6d5"

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        study: dict[str, Any] | XComArg,
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("trigger_rule", "all_done_min_one_success")
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.study = study
        self.mlflow_conn_id = mlflow_conn_id

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.tuning.report import log_study, summarize
        from airflow_trainpipe.tuning.study import open_study

        ref = _study_ref(self.study)
        study = open_study(self.config, ref.study_name, _storage_url(self.config))
        summary = summarize(study, ref)
        hook = MlflowHook(self.mlflow_conn_id)
        with hook.activated():
            log_study(hook.get_conn(), study, summary)
        self.log.info(
            "study %s: %d trial(s), %d pruned (%d at the first rung), %d failed; best %s = %s (trial %s) "
            "with %s; %.4f device-hours (every trial at the full budget: %.4f)",
            summary.study_name, summary.trials, summary.pruned, summary.pruned_at_first_rung, summary.failed,
            summary.metric, summary.best, summary.best_trial, summary.best_params, summary.compute_hours,
            summary.full_budget_compute_hours,
        )  # fmt: skip
        if summary.candidate is None:
            raise AirflowFailException(
                f"no trial of study {summary.study_name} completed ({summary.pruned} pruned, "
                f"{summary.failed} failed): there is no candidate"
            )
        return summary.to_xcom()
