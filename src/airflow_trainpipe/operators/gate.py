"""BaselineGateOperator: the `gate` task, candidate vs champion on the same holdout.

The training job's final evaluation scored both models on the run's holdout and logged
`candidate_<metric>` / `champion_<metric>` on the candidate's MLflow run; this task applies the
config's rule (`airflow_trainpipe.promotion`) to those numbers. A losing candidate skips the
downstream tasks (register) the way Airflow's ShortCircuitOperator does, so the DAG run stays
green and the reason is in this task's log, its XCom and the MLflow run.

Champion drift: when the version holding the alias now is not the one the candidate was scored
against (someone promoted a model in between), the gate fails instead of deciding on stale
numbers; re-running `train` re-scores against the new champion. RegisterModelOperator checks
the same again just before it moves the alias.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, SkipMixin
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.config import PipelineConfig, load_config

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_trainpipe.promotion import Decision

NO_CHAMPION = "none"  # runtime.evaluation.NO_CHAMPION, without importing the runtime
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off", "", "none"}


def as_bool(value: Any, name: str) -> bool:
    """A templated flag renders to a string ('True'); accept the usual spellings only."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise AirflowFailException(f"{name} must be true or false, got {value!r}")


class BaselineGateOperator(BaseOperator, SkipMixin):
    """Decide whether the candidate replaces the champion; skip registration when it does not.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param mlflow_run_id: the candidate's MLflow run (templated); default: the `mlflow_run_id` of
        the `train_task_id` task's XCom.
    :param train_task_id: task whose XCom holds the training result.
    :param force: promote whatever the rules say (templated, e.g. `{{ params.force }}`); the
        decision records that it was forced.
    :param mlflow_conn_id: `mlflow` connection; undefined `mlflow_default`: the embedded store.
    """

    template_fields: Sequence[str] = ("mlflow_run_id", "force")
    ui_color = "#fff2cc"
    inherits_from_skipmixin = True

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        mlflow_run_id: str | None = None,
        train_task_id: str = "train",
        force: bool | str = False,
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = config if isinstance(config, PipelineConfig) else load_config(config)
        self.mlflow_run_id = mlflow_run_id
        self.train_task_id = train_task_id
        self.force = force
        self.mlflow_conn_id = mlflow_conn_id

    def _run_id(self, context: Context) -> str:
        if self.mlflow_run_id:
            return str(self.mlflow_run_id)
        result = context["ti"].xcom_pull(task_ids=self.train_task_id)
        if not isinstance(result, dict) or not result.get("mlflow_run_id"):
            raise AirflowFailException(f"no mlflow_run_id in the XCom of task {self.train_task_id!r}; pass mlflow_run_id")
        return str(result["mlflow_run_id"])

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.hooks.mlflow import MlflowHook

        force = as_bool(self.force, "force")
        run_id = self._run_id(context)
        hook = MlflowHook(self.mlflow_conn_id)
        with hook.activated():
            client = hook.get_conn()
            decision, candidate, champion, scored_version = self._decide(client, run_id, force)
            report = self._report(decision, run_id, scored_version)
            self._log_to_run(client, run_id, decision, report, candidate, champion)
        if decision.fail:
            raise AirflowFailException(f"gate for run {run_id}: {decision.reason}")
        if decision.promote:
            self.log.info("promote: %s", decision.reason)
            return report
        self.log.info("keep the champion, skip registration: %s", decision.reason)
        ti = context["ti"]
        ti.xcom_push(key="return_value", value=report)  # skip() ends execute: push the decision first
        downstream = [t for t in context["task"].get_flat_relatives(upstream=False) if not t.is_teardown]
        if downstream:
            self.skip(ti=ti, tasks=downstream)
        return report

    def _decide(self, client: Any, run_id: str, force: bool) -> tuple[Decision, dict[str, float], dict[str, float] | None, str | None]:
        from airflow_trainpipe.promotion import Decision, comparison_table, decide

        run = candidate_run(client, run_id)
        if run.info.status != "FINISHED":
            raise AirflowFailException(f"candidate MLflow run {run_id} is {run.info.status}, not FINISHED")
        metrics, tags = run.data.metrics, run.data.tags
        needed = [self.config.gate.metric, *(g.metric for g in self.config.gate.guardrails)]
        candidate = self._metrics(metrics, "candidate", run_id)
        missing = [m for m in needed if m not in candidate]
        if missing:
            raise AirflowFailException(f"MLflow run {run_id} has no metric {', '.join('candidate_' + m for m in missing)}")
        scored_version = tags.get("trainpipe.champion.version")
        if scored_version is None:
            raise AirflowFailException(f"MLflow run {run_id} has no tag trainpipe.champion.version: the champion was not scored")
        champion: dict[str, float] | None = None
        if scored_version != NO_CHAMPION:
            champion = self._metrics(metrics, "champion", run_id)
            missing = [m for m in needed if m not in champion]
            if missing and not force:
                cause = tags.get("trainpipe.champion.error") or "the metric was not logged"
                raise AirflowFailException(
                    f"MLflow run {run_id} has no metric {', '.join('champion_' + m for m in missing)} for champion "
                    f"version {scored_version}: {cause}"
                )
        self._check_champion_unchanged(client, run_id, scored_version, force)
        if champion is not None and missing:  # forced, and the champion could not be scored
            cause = tags.get("trainpipe.champion.error") or f"metric(s) {', '.join(missing)} not logged"
            champion = None
            decision = Decision(
                promote=True, forced=True, metric=self.config.gate.metric, direction=self.config.gate_direction,
                candidate=candidate[self.config.gate.metric], champion=None,
                reason=f"forced promotion; champion version {scored_version} could not be compared: {cause}",
            )
        else:
            decision = decide(self.config.gate, self.config.training.task, candidate, champion, force=force)
        self.log.info("candidate run %s vs champion %s\n%s", run_id,
                      "none" if scored_version == NO_CHAMPION else f"{self.config.registered_model_name} v{scored_version}",
                      comparison_table(decision, candidate, champion))
        return decision, candidate, champion, None if scored_version == NO_CHAMPION else scored_version

    @staticmethod
    def _metrics(metrics: dict[str, float], prefix: str, run_id: str) -> dict[str, float]:
        return {key.removeprefix(f"{prefix}_"): value for key, value in metrics.items() if key.startswith(f"{prefix}_")}

    def _check_champion_unchanged(self, client: Any, run_id: str, scored_version: str, force: bool) -> None:
        from airflow_trainpipe.registry import current_champion

        name, alias = self.config.registered_model_name, self.config.registration.alias
        now = current_champion(client, name, alias)
        now_version = now[0] if now else NO_CHAMPION
        if now_version != scored_version and force:
            self.log.warning("the champion changed since run %s was scored (version %s, now %s); promoting anyway: forced",
                             run_id, scored_version, now_version)
        elif now_version != scored_version:
            raise AirflowFailException(
                f"the champion changed since run {run_id} was scored: {name}@{alias} was version {scored_version}, "
                f"now {now_version}; re-run the train task to score the candidate against the current champion"
            )

    def _report(self, decision: Decision, run_id: str, scored_version: str | None) -> dict[str, Any]:
        return {
            **decision.as_dict(),
            "mlflow_run_id": run_id,
            "model_name": self.config.registered_model_name,
            "alias": self.config.registration.alias,
            "champion_version": scored_version,
        }

    def _log_to_run(self, client: Any, run_id: str, decision: Decision, report: dict[str, Any],
                    candidate: dict[str, float], champion: dict[str, float] | None) -> None:
        client.log_dict(run_id, report, "gate/decision.json")
        client.set_tag(run_id, "trainpipe.gate.promote", str(decision.promote).lower())
        client.set_tag(run_id, "trainpipe.gate.forced", str(decision.forced).lower())
        client.set_tag(run_id, "trainpipe.gate.reason", decision.reason[:5000])
        figure = comparison_chart(decision, candidate, champion)
        try:
            client.log_figure(run_id, figure, "gate/comparison.png")
        finally:
            import matplotlib.pyplot as plt

            plt.close(figure)


def candidate_run(client: Any, run_id: str) -> Any:
    """The candidate's MLflow run: a run that does not exist fails the task for good; a registry
    that cannot be reached raises RegistryUnavailable, which Airflow retries."""
    from airflow_trainpipe.registry import RegistryError, RegistryUnavailable, get_run

    try:
        return get_run(client, run_id)
    except RegistryUnavailable:
        raise
    except RegistryError as exc:
        raise AirflowFailException(f"candidate {exc}") from exc


def comparison_chart(decision: Decision, candidate: dict[str, float], champion: dict[str, float] | None) -> Any:
    """One panel per metric (their scales differ): candidate vs champion bars, the verdict on top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [decision.metric, *(g.metric for g in decision.guardrails)]
    names += sorted(m for m in candidate if m not in names)
    columns = 4
    rows = (len(names) + columns - 1) // columns
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows + 0.6), squeeze=False)
    breached = {g.metric for g in decision.guardrails if not g.passed}
    for ax, name in zip(axes.flat, names, strict=False):
        labels, values, colors = ["candidate"], [candidate[name]], ["#4c72b0"]
        if champion is not None and name in champion:
            labels.append("champion")
            values.append(champion[name])
            colors.append("#999999")
        ax.bar(labels, values, color=colors)
        for i, value in enumerate(values):
            ax.annotate(f"{value:.4g}", (i, value), ha="center", va="bottom", fontsize=8)
        role = " (primary)" if name == decision.metric else " (guardrail BREACHED)" if name in breached else ""
        ax.set_title(name + role, fontsize=9, color="#c44e52" if name in breached else "black")
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    verdict = ("PROMOTE" + (" (forced)" if decision.forced else "")) if decision.promote else "KEEP CHAMPION"
    figure.suptitle(f"{verdict}: {decision.reason[:140]}", fontsize=9)
    figure.tight_layout()
    return figure
