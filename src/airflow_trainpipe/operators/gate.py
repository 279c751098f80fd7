"""BaselineGateOperator: the `gate` task, candidate vs champion on the same holdout.

The training job's final evaluation scored both models on the run's holdout and logged
`candidate_<metric>` / `champion_<metric>` on the candidate's MLflow run; this task applies the
config's rule (`airflow_trainpipe.registry.promotion`) to those numbers. A losing candidate skips the
downstream tasks (register) the way Airflow's ShortCircuitOperator does, so the DAG run stays
green and the reason is in this task's log, its XCom and the MLflow run. Every decision also
logs an HTML report (registry/gate_report.py) to the candidate's run, linked from the task as "Gate report".

Champion drift: when the version holding the alias now is not the one the candidate was scored
against (someone promoted a model in between), the gate fails instead of deciding on stale
numbers; re-running `train` re-scores against the new champion. RegisterModelOperator checks
the same again just before it moves the alias.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache, partial
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator, SkipMixin
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.contracts.payloads import GateDecision
from airflow_trainpipe.contracts.tags import NO_CHAMPION
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import GateReportLink
from airflow_trainpipe.openlineage.reporting import OpenLineageReporting

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_trainpipe.contracts.payloads import Evaluation

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


class BaselineGateOperator(TrainpipeRetryPolicyMixin, OpenLineageReporting, BaseOperator, SkipMixin):
    """Decide whether the candidate replaces the champion; skip registration when it does not.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param mlflow_run_id: gate this MLflow run (templated), reading the metrics the training job
        logged on it; default: the TrainResult of the `train_task_id` task's XCom.
    :param train_task_id: task whose XCom holds the training result.
    :param force: promote whatever the rules say (templated, e.g. `{{ params.force }}`); the
        decision records that it was forced.
    :param mlflow_conn_id: `mlflow` connection; undefined `mlflow_default`: the embedded store.
    """

    template_fields: Sequence[str] = ("mlflow_run_id", "force")
    ui_color = "#fff2cc"
    operator_extra_links = (GateReportLink(),)
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
        self.config = as_config(config)
        self.mlflow_run_id = mlflow_run_id
        self.train_task_id = train_task_id
        self.force = force
        self.mlflow_conn_id = mlflow_conn_id
        # What OpenLineage is told (openlineage/lineage.gate): the decision and what it compared.
        self._lineage_decision: GateDecision | None = None
        self._lineage_tracking_uri = ""

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.gate_report import gate_report_html
        from airflow_trainpipe.registry.records import record_gate_decision

        force = as_bool(self.force, "force")
        hook = MlflowHook(self.mlflow_conn_id)
        run_id, evaluation, logged = self._evaluation(context, hook)
        decision = self._decide(hook, run_id, evaluation, force)
        self._lineage_decision, self._lineage_tracking_uri = decision, hook.tracking_uri
        figure = comparison_chart(decision, evaluation.candidate, evaluation.champion)
        try:
            curves = (logged() or {}).get("curves")
            report = gate_report_html(
                decision,
                evaluation,
                self.config.training.task,
                curves,
                figure,
                slice_guardrail=self.config.gate.slice_guardrail is not None,
            )
            GateReportLink.persist(context, record_gate_decision(hook, run_id, decision, figure, report))
        finally:
            import matplotlib.pyplot as plt

            plt.close(figure)
        result = decision.as_dict()
        if decision.fail:
            raise AirflowFailException(f"gate for run {run_id}: {decision.reason}")
        if decision.promote:
            self.log.info("promote: %s", decision.reason)
            return result
        self.log.info("keep the champion, skip registration: %s", decision.reason)
        ti = context["ti"]
        ti.xcom_push(key="return_value", value=result)  # skip() ends execute: push the decision first
        downstream = [t for t in context["task"].get_flat_relatives(upstream=False) if not t.is_teardown]
        if downstream:
            self.skip(ti=ti, tasks=downstream)
        return result

    def _openlineage(self) -> Any:
        from airflow_trainpipe.openlineage import lineage

        return lineage.gate(self.config, self._lineage_decision, self._lineage_tracking_uri)

    def _evaluation(
        self, context: Context, hook: Any
    ) -> tuple[str, Evaluation, Callable[[], dict[str, Any] | None]]:
        """The candidate's run and both metric sets: from the train task's TrainResult, or, for a
        run named by `mlflow_run_id`, from what the job logged on that run. Last, the run's logged
        evaluation.json, downloaded once when first asked for (slices, the report's curves)."""
        from airflow_trainpipe.contracts.payloads import SliceScore, TrainResult, read_payload
        from airflow_trainpipe.registry import reads

        if self.mlflow_run_id:
            run_id = str(self.mlflow_run_id)
            logged = cache(partial(hook.call, reads.logged_evaluation, run_id))
            evaluation = hook.call(reads.run_evaluation, run_id)
            if self.config.gate.slice_guardrail is not None:  # in the run's evaluation.json
                slices = (logged() or {}).get("slices")
                scores = None if slices is None else [SliceScore.model_validate(s) for s in slices]
                evaluation = evaluation.model_copy(update={"slices": scores})
            return run_id, evaluation, logged
        result = read_payload(
            TrainResult,
            context["ti"].xcom_pull(task_ids=self.train_task_id),
            f"the XCom of task {self.train_task_id!r}",
        )
        evaluation, _ = result.candidate(f"the XCom of task {self.train_task_id!r}")
        run_id = result.mlflow_run_id
        hook.call(reads.finished_run, run_id)
        return run_id, evaluation, cache(partial(hook.call, reads.logged_evaluation, run_id))

    def _decide(self, hook: Any, run_id: str, evaluation: Evaluation, force: bool) -> GateDecision:
        from airflow_trainpipe.registry.promotion import comparison_table, decide

        needed = [self.config.gate.metric, *(g.metric for g in self.config.gate.guardrails)]
        missing = [m for m in needed if m not in evaluation.candidate]
        if missing:
            raise AirflowFailException(
                f"MLflow run {run_id} has no metric {', '.join('candidate_' + m for m in missing)}"
            )
        champion = evaluation.champion
        unscored = [m for m in needed if m not in champion] if champion is not None else []
        if unscored and not force:
            cause = evaluation.champion_error or "the metric was not logged"
            raise AirflowFailException(
                f"MLflow run {run_id} has no metric {', '.join('champion_' + m for m in unscored)} for champion "
                f"version {evaluation.champion_version}: {cause}"
            )
        self._check_champion_unchanged(hook, run_id, evaluation.champion_version, force)
        if unscored:  # forced, and the champion could not be scored
            cause = evaluation.champion_error or f"metric(s) {', '.join(unscored)} not logged"
            champion = None
            decision = GateDecision(
                promote=True,
                forced=True,
                metric=self.config.gate.metric,
                direction=self.config.gate_direction,
                candidate=evaluation.candidate[self.config.gate.metric],
                champion=None,
                reason=f"forced promotion; champion version {evaluation.champion_version} could not be compared: {cause}",
            )
        else:
            decision = decide(
                self.config.gate,
                self.config.training.task,
                evaluation.candidate,
                champion,
                force=force,
                interval=evaluation.improvement_interval,
                slices=evaluation.slices,
            )
        decision.mlflow_run_id, decision.champion_version = run_id, evaluation.champion_version
        decision.model_name, decision.alias = (
            self.config.registered_model_name,
            self.config.registration.alias,
        )
        self.log.info(
            "candidate run %s vs champion %s\n%s",
            run_id,
            f"{decision.model_name} v{evaluation.champion_version}"
            if evaluation.champion_version
            else "none",
            comparison_table(decision, evaluation.candidate, champion),
        )
        return decision

    def _check_champion_unchanged(
        self, hook: Any, run_id: str, scored_version: str | None, force: bool
    ) -> None:
        from airflow_trainpipe.registry.reads import current_champion

        name, alias = self.config.registered_model_name, self.config.registration.alias
        now = hook.call(current_champion, name, alias)
        now_version = now[0] if now else None
        if now_version != scored_version and force:
            self.log.warning(
                "the champion changed since run %s was scored (version %s, now %s); promoting anyway: forced",
                run_id,
                scored_version or NO_CHAMPION,
                now_version or NO_CHAMPION,
            )
        elif now_version != scored_version:
            raise AirflowFailException(
                f"the champion changed since run {run_id} was scored: {name}@{alias} was version {scored_version or NO_CHAMPION}, "
                f"now {now_version or NO_CHAMPION}; re-run the train task to score the candidate against the current champion"
            )


def comparison_chart(
    decision: GateDecision, candidate: dict[str, float], champion: dict[str, float] | None
) -> Any:
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
        role = (
            " (primary)" if name == decision.metric else " (guardrail BREACHED)" if name in breached else ""
        )
        ax.set_title(name + role, fontsize=9, color="#c44e52" if name in breached else "black")
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    verdict = ("PROMOTE" + (" (forced)" if decision.forced else "")) if decision.promote else "KEEP CHAMPION"
    figure.suptitle(f"{verdict}: {decision.reason[:140]}", fontsize=9)
    figure.tight_layout()
    return figure
