"""One training job, started and followed to its end: the only place that does it.

The train task, a tuning trial's task, `trainpipe train` and `trainpipe tune` each hand over a
TrainSpec and a Placement and get the job's TrainResult, or a TrainingJobError that says whether a
retry can help. What a caller used to write for itself, and wrote four times over:

- where the job runs: a torchrun child of this process, a job forked from the warm parent (a CPU
  job, launchers/forked.py), or pods (one node: a KubernetesPodOperator; several: an Indexed Job);
- how many ranks, how many threads each (local jobs share the host's cores) and the pods' labels;
- the watch loop (JobWatcher over every line: the typed result, the errors, task_state_store) and,
  when the followed log never carried the result, result.json in the run directory.

A caller keeps the TrainingJob to stop it (the task's on_kill): SIGTERM, so every rank checkpoints
its step, then SIGKILL after the grace; for pods, the provider's own on_kill.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_trainpipe.contracts.payloads import TrainResult
from airflow_trainpipe.contracts.train_spec import TrainSpec
from airflow_trainpipe.core.exceptions import TrainingJobError
from airflow_trainpipe.launchers.kubernetes_manifests import RunLabels
from airflow_trainpipe.launchers.local import LocalLauncher
from airflow_trainpipe.launchers.watcher import JobWatcher

OnLine = Callable[[str], None]


@dataclass(frozen=True)
class Pods:
    """Airflow's side of a job on Kubernetes: the task it runs for."""

    context: Any
    """The task's Airflow context (the provider's operators run in it)."""
    task_id: str
    log: Any
    dag_id: str
    airflow_run_id: str
    secret_env: Mapping[str, str] = field(default_factory=dict)
    """Values for the try's Secret beside the connection credentials (a study's storage URL)."""


@dataclass(frozen=True)
class Placement:
    """Where a job runs and what it is given."""

    nproc: int | None = None
    """Processes per node; None: `training.resources`."""
    env: Mapping[str, str] = field(default_factory=dict)
    """For a local job's every rank, over this process's environment (credentials travel here,
    never on a command line or in the spec)."""
    jobs_on_host: int = 1
    """Local jobs that run at once on this host (trials side by side): they share its cores."""
    fork: bool = False
    """A CPU job is forked from the warm parent, torchrun's agent and its ranks alike (`trainpipe
    tune`, many jobs from one process); a GPU job runs under the torchrun command all the same."""
    pods: Pods | None = None
    """On Kubernetes (`training.launcher: kubernetes`) instead of here."""
    try_number: int | None = None
    """The Airflow try this attempt is (the ranks' TRAINPIPE_TRY_NUMBER, the pods' labels)."""
    show_raw: bool = True
    """Also hand the job's plain output lines (not only its events) to `on_line`."""

    def job_env(self) -> dict[str, str]:
        try_number = {} if self.try_number is None else {"TRAINPIPE_TRY_NUMBER": str(self.try_number)}
        return {**self.env, **try_number}

    def attempt(self) -> str:
        return "" if self.try_number is None else f" (try {self.try_number})"


def labels_for(spec: TrainSpec, dag_id: str, task_id: str, airflow_run_id: str, try_number: int) -> RunLabels:
    """Who a job's pods belong to. The mapped task instances of tuning trials share their task id:
    the trial's run id and budget make each one's name its own."""
    run = airflow_run_id
    if spec.trial is not None:
        hp = spec.hyperparameters
        run = f"{spec.run_id}.e{hp.epochs}s{hp.max_steps or 0}"
    return RunLabels(dag_id, task_id, run, try_number)


class TrainingJob:
    """One attempt of one job. `store`: the task's task_state_store (the MLflow run id and the
    newest checkpoint survive the worker), or None."""

    def __init__(self, spec: TrainSpec, placement: Placement, store: Any = None):
        self.spec, self.placement = spec, placement
        self.nproc = placement.nproc or spec.config.training.resources.nproc_per_node
        self.watcher = JobWatcher(store, show_raw=placement.show_raw, tail=40)
        self._launcher: LocalLauncher | None = None
        self._pod_operator: Any = None

    def run(self, on_line: OnLine | None = None) -> TrainResult:
        """To its end; every line worth showing goes to `on_line`."""
        if self.placement.pods is not None:
            result = self._on_kubernetes(self.placement.pods)
        else:
            result = self._here(on_line or (lambda _: None))
        return result.model_copy(update={"run_dir": self.spec.run_dir})

    def stop(self, grace_s: float) -> None:
        if self._pod_operator is not None:
            self._pod_operator.on_kill()  # deletes the pod / the Job (and with it the Service)
        elif self._launcher is not None:
            self._launcher.stop(grace_s)

    # -- here -----------------------------------------------------------------------------------

    def forked(self) -> bool:
        """Placed to fork, and a job that can be: a CPU job (launchers/forked.py)."""
        from airflow_trainpipe.launchers.forked import forkable

        return self.placement.fork and forkable(self.spec.config.training.resources.gpus_per_node)

    def launcher(self) -> LocalLauncher:
        placement = self.placement
        env = placement.job_env()
        if self.forked():
            from airflow_trainpipe.launchers.forked import ForkedLauncher

            return ForkedLauncher(self.spec, self.nproc, env=env, jobs_on_host=placement.jobs_on_host)
        return LocalLauncher(self.spec, self.nproc, env=env, jobs_on_host=placement.jobs_on_host)

    def _here(self, on_line: OnLine) -> TrainResult:
        launcher = self._launcher = self.launcher()
        launcher.start()
        try:
            for line in launcher.lines():
                if (shown := self.watcher.feed(line.text)) is not None:
                    on_line(shown)
            code = launcher.wait()
        finally:
            launcher.kill()  # timeouts and exceptions land here: no rank outlives the caller
        if code != 0:
            raise self.watcher.failure(
                f"training job exited with code {code}{self.placement.attempt()} [{self.spec.run_id}]",
                f"a retry resumes from the newest complete checkpoint under {self.spec.run_dir}/checkpoints",
                exit_code=code,
            )
        return self.watcher.result or stored_result(self.spec.run_dir)

    # -- on Kubernetes --------------------------------------------------------------------------

    def pod_operator(self, pods: Pods) -> Any:
        """The KubernetesPodOperator (one node) or KubernetesJobOperator (several) of this try."""
        from airflow_trainpipe.launchers import kubernetes_cluster as cluster

        labels = self._labels(pods)
        single = self.spec.config.training.resources.nodes == 1
        build = cluster.pod_operator if single else cluster.job_operator
        return build(self.spec, labels, pods.task_id, self.watcher)

    def _on_kubernetes(self, pods: Pods) -> TrainResult:
        from airflow_trainpipe.launchers import kubernetes_cluster as cluster

        config = self.spec.config
        operator = self._pod_operator = self.pod_operator(pods)
        labels = self._labels(pods)
        resources = config.training.resources
        pods.log.info(
            "starting %d pod(s) x %d process(es) on Kubernetes; run directory %s",
            resources.nodes,
            resources.nproc_per_node,
            self.spec.run_dir,
        )
        try:
            run = cluster.run_pod if resources.nodes == 1 else cluster.run_job
            run(operator, config, labels, pods.context, pods.log, dict(pods.secret_env))
        except Exception as exc:
            raise self.watcher.failure(
                f"training on Kubernetes failed{self.placement.attempt()}",
                "a retry starts new pods that resume "
                f"from the newest complete checkpoint under {self.spec.run_dir}/checkpoints",
                cause=exc,
            ) from exc
        return self.watcher.result or stored_result(self.spec.run_dir)

    def _labels(self, pods: Pods) -> RunLabels:
        try_number = self.placement.try_number or 1
        return labels_for(self.spec, pods.dag_id, pods.task_id, pods.airflow_run_id, try_number)


def run_training(
    spec: TrainSpec, placement: Placement, on_line: OnLine | None = None, store: Any = None
) -> TrainResult:
    """One job to its end (see TrainingJob): its result, with `run_dir`, or a TrainingJobError."""
    return TrainingJob(spec, placement, store).run(on_line)


def stored_result(run_dir: str) -> TrainResult:
    """The job's result.json, when the followed output did not carry the result event (a worker
    that reattached after the pod finished)."""
    from airflow_trainpipe.contracts.artifacts import RESULT_ARTIFACT
    from airflow_trainpipe.contracts.payloads import read_payload
    from airflow_trainpipe.core.storage import filesystem, join

    fs, path = filesystem(join(run_dir, RESULT_ARTIFACT))
    try:
        text = fs.cat_file(path)
    except FileNotFoundError as exc:
        raise TrainingJobError(
            f"the training job ended without reporting a result, and {run_dir}/result.json does not exist"
        ) from exc
    return read_payload(TrainResult, json.loads(text), f"{run_dir}/result.json")
