"""The `canary` task group: start -> step_1 ... step_n -> promote.

`canary.start` serves the staged version beside the champion (canary/local.py) and gives it
`canary.alias`; each `canary.step_<n>` moves the candidate's traffic share and waits in the
triggerer (CanaryStepTrigger) while its checks are read; `canary.promote` moves the champion alias
when every step held. A step that fails puts all traffic back on the champion, tags the version
with what failed, and fails (not retried: the evidence will not change); nothing is promoted.

The canary's state is a folder per pipeline and version under TRAINPIPE_HOME/canary: the backend's
processes (deployment.json), the router's request log, and each step's window (steps.json, written
once), so a retried or restarted task resumes the step it was in instead of starting it again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_trainpipe.config import PipelineConfig, as_config
from airflow_trainpipe.contracts.artifacts import CANARY_REPORT_ARTIFACT
from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin
from airflow_trainpipe.links.mlflow import CanaryReportLink, MlflowModelVersionLink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_trainpipe.canary.local import LocalCanary
    from airflow_trainpipe.canary.sagemaker import SageMakerCanary
    from airflow_trainpipe.config.canary import CanarySection

STEPS_FILE = "steps.json"
VERDICTS_FILE = "verdicts.json"


def canary_state(config: PipelineConfig, version: str) -> Path:
    from airflow_trainpipe.core.storage import trainpipe_home

    return trainpipe_home() / "canary" / config.pipeline / f"v{version}"


def _section(config: PipelineConfig) -> CanarySection:
    if config.canary is None:
        raise ValueError(f"pipeline {config.pipeline} has no canary section")
    return config.canary


def _backend(config: PipelineConfig, version: str, env: dict[str, str] | None = None) -> LocalCanary:
    from airflow_trainpipe.canary.local import LocalCanary

    return LocalCanary(canary_state(config, version), _section(config).local, env=env)


def _sagemaker(section: CanarySection) -> SageMakerCanary | None:
    """The SageMaker backend of a section that has it; None for the local one."""
    if section.backend != "sagemaker":
        return None
    from airflow_trainpipe.canary.sagemaker import SageMakerCanary

    assert section.sagemaker is not None  # the config requires it with this backend
    return SageMakerCanary(section.sagemaker)


def _serving(config: PipelineConfig, version: str) -> LocalCanary | SageMakerCanary:
    """Where the traffic moves: the local router, or the SageMaker endpoint's variant weights."""
    return _sagemaker(_section(config)) or _backend(config, version)


class _CanaryTask(TrainpipeRetryPolicyMixin, BaseOperator):
    template_fields: Sequence[str] = ()
    ui_color = "#fdebd0"
    operator_extra_links = (MlflowModelVersionLink(), CanaryReportLink())

    def __init__(
        self,
        *,
        config: PipelineConfig | str,
        register_task_id: str = "register",
        start_task_id: str = "canary.start",
        mlflow_conn_id: str | None = "mlflow_default",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.config = as_config(config)
        self.register_task_id = register_task_id
        self.start_task_id = start_task_id
        self.mlflow_conn_id = mlflow_conn_id

    def _staged(self, context: Context) -> dict[str, Any]:
        staged: dict[str, Any] = context["ti"].xcom_pull(task_ids=self.register_task_id) or {}
        if "version" not in staged:
            raise ValueError(f"task {self.register_task_id!r} staged no model version")
        MlflowModelVersionLink.persist(context, staged.get("model_version_url"))
        return staged

    def _started(self, context: Context) -> dict[str, Any]:
        return dict(context["ti"].xcom_pull(task_ids=self.start_task_id) or {})


class CanaryStartOperator(_CanaryTask):
    """Serve the staged version beside the champion; the candidate gets `canary.alias`.

    Skips the steps when no version holds the champion alias yet: there is nothing to compare
    with, and `canary.promote` makes the first champion.

    :param config: the parsed pipeline config, or the path of its YAML file.
    :param register_task_id: task whose XCom is the staged version.
    :param mlflow_conn_id: `mlflow` connection; undefined `mlflow_default`: the embedded store.
    """

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowSkipException

        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.reads import current_champion, version_threshold
        from airflow_trainpipe.registry.versions import stage_version

        staged = self._staged(context)
        name, version = staged["model_name"], staged["version"]
        hook = MlflowHook(self.mlflow_conn_id)
        champion = hook.call(current_champion, name, self.config.registration.alias)
        if champion is None or champion[0] == version:
            raise AirflowSkipException(
                f"{name} has no other @{self.config.registration.alias}: nothing to canary against"
            )
        section = _section(self.config)
        stage_version(hook, name, section.alias, version)
        if (sagemaker := _sagemaker(section)) is not None:
            router = sagemaker.start()
        else:
            _stop_earlier_canaries(self.config, version)
            backend = _backend(self.config, version, hook.environment())
            router = backend.start(f"models:/{name}/{champion[0]}", f"models:/{name}/{version}")
        thresholds = {  # each version's own (the training job tunes it)
            "champion": hook.call(version_threshold, name, champion[0]),
            "candidate": hook.call(version_threshold, name, version),
        }
        self.log.info(
            "%s version %s (@%s) serves beside version %s (@%s); clients send requests to %s/invocations",
            name, version, section.alias, champion[0], self.config.registration.alias, router,
        )  # fmt: skip
        return {
            "version": version,
            "champion_version": champion[0],
            "router": router,
            "thresholds": thresholds,
        }


def _stop_earlier_canaries(config: PipelineConfig, version: str) -> None:
    """An earlier canary's router keeps serving its survivor until the next canary starts: one
    serving set per pipeline (their request logs stay, as evidence)."""
    folder = canary_state(config, version).parent
    for state in folder.glob("v*") if folder.exists() else ():
        if state.name != f"v{version}":
            _backend(config, state.name[1:]).stop()


class CanaryStepOperator(_CanaryTask):
    """Step `step` (1-based) of `canary.steps`: move the share, wait in the triggerer, judge.

    :param step: which step of `canary.steps` (1-based).
    Every other parameter is CanaryStartOperator's.
    """

    def __init__(self, *, step: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step = step

    def execute(self, context: Context) -> None:
        started = self._started(context)
        section = _section(self.config)
        percent = section.steps[self.step - 1]
        from airflow_trainpipe.canary.router import REQUESTS_FILE

        sagemaker = _sagemaker(section)
        (sagemaker or _backend(self.config, started["version"])).set_percent(percent)
        state = canary_state(self.config, started["version"])
        state.mkdir(parents=True, exist_ok=True)  # a SageMaker canary keeps its windows here too
        since = _step_window(state, self.step)
        until = since + section.step_duration.total_seconds()
        self.log.info(
            "step %d: %g%% of the traffic on version %s until %s",
            self.step, percent, started["version"], time.strftime("%H:%M:%S", time.localtime(until)),
        )  # fmt: skip
        from airflow_trainpipe.triggers.canary_step import CanaryStepTrigger

        self.defer(
            trigger=CanaryStepTrigger(
                requests_log=str(state / REQUESTS_FILE),
                since=since,
                until=until,
                checks=section.checks.model_dump(mode="json"),
                thresholds=started["thresholds"],
                poll_interval=section.poll_interval.total_seconds(),
                sagemaker=sagemaker.settings.model_dump(mode="json") if sagemaker else None,
                confidence=section.confidence,
                undecided=section.undecided,
            ),
            method_name="execute_complete",
            # The trigger fires at `until` at the latest; the margin is the triggerer's own delay.
            timeout=timedelta(seconds=max(0.0, until - time.time()))
            + section.poll_interval * 2
            + timedelta(minutes=5),
        )

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context: Context) -> Any:
        """A trigger that timed out or failed gave no verdict: the step fails, and rolls back first
        (left alone, the candidate would keep its share with nobody watching)."""
        from airflow.sdk.exceptions import TaskDeferralError, TaskDeferralTimeout

        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except (TaskDeferralError, TaskDeferralTimeout) as exc:  # neither derives from the other
            started = self._started(context)
            reason = f"no verdict from the triggerer: {type(exc).__name__}: {exc}"
            self._roll_back(started, [reason], {})
            raise

    def execute_complete(self, context: Context, event: dict[str, Any]) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        started = self._started(context)
        section = _section(self.config)
        figures = event.get("figures", {})
        percent = section.steps[self.step - 1]
        self.log.info("step %d (%g%%): %s", self.step, percent, json.dumps(figures))
        reasons = event.get("failed") or [event.get("message", "the step's checks could not be read")]
        held = event.get("status") == "held"
        _record_verdict(
            canary_state(self.config, started["version"]),
            {**event, "step": self.step, "percent": percent, "failed": [] if held else reasons},
        )
        if event.get("checks"):
            from airflow_trainpipe.hooks.mlflow import MlflowHook
            from airflow_trainpipe.registry.records import record_canary_step

            record_canary_step(
                MlflowHook(self.mlflow_conn_id), self.config.registered_model_name, started["version"],
                self.step, event["checks"],
            )  # fmt: skip
        if held:
            return {"step": self.step, "percent": percent, **figures}
        for example in event.get("examples", []):
            self.log.info("disagreement: %s", example)
        self._roll_back(started, reasons, figures)
        _report(context, self, self.config, started, "rolled_back", reasons)
        raise AirflowFailException(
            f"canary step {self.step} ({percent:g}% of the traffic) failed: "
            f"{'; '.join(reasons)}. All traffic is back on version {started['champion_version']}."
        )

    def _roll_back(self, started: dict[str, Any], reasons: list[str], figures: dict[str, Any]) -> None:
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.records import record_canary_rollback

        hook = MlflowHook(self.mlflow_conn_id)
        version = started["version"]
        _serving(self.config, version).rollback()
        reason, actor = "; ".join(reasons), f"airflow:{self.dag_id}"
        record_canary_rollback(hook, self.config, version, self.step, reason, figures, actor)


def _record_verdict(state: Path, verdict: dict[str, Any]) -> None:
    from airflow_trainpipe.canary.state_files import write_json

    path = state / VERDICTS_FILE
    verdicts = [
        v for v in (json.loads(path.read_text()) if path.exists() else []) if v["step"] != verdict["step"]
    ]
    write_json(path, sorted([*verdicts, verdict], key=lambda v: v["step"]))


def _report(
    context: Context,
    task: Any,
    config: PipelineConfig,
    started: dict[str, Any],
    outcome: str,
    failed: list[str],
) -> None:
    """The canary's HTML report, logged to the version's run; its URL on the version and the task's link."""
    from airflow_trainpipe.canary.checks import traffic_over_time
    from airflow_trainpipe.canary.router import REQUESTS_FILE
    from airflow_trainpipe.hooks.mlflow import MlflowHook
    from airflow_trainpipe.registry.canary_report import canary_report_html
    from airflow_trainpipe.registry.records import record_canary_report

    name, version = config.registered_model_name, started["version"]
    state = canary_state(config, version)
    path = state / VERDICTS_FILE
    page = canary_report_html(
        name, version, started["champion_version"], outcome,
        json.loads(path.read_text()) if path.exists() else [],
        traffic_over_time(state / REQUESTS_FILE),
        _section(config).checks.model_dump(mode="json"), failed,
    )  # fmt: skip
    (state / "report.html").write_text(page)
    link = record_canary_report(MlflowHook(task.mlflow_conn_id), name, version, page, CANARY_REPORT_ARTIFACT)
    CanaryReportLink.persist(context, link)


def _step_window(state: Path, step: int) -> float:
    """When `step` started: the first attempt's time, kept, so a retry judges the same window."""
    from airflow_trainpipe.canary.state_files import write_json

    path = state / STEPS_FILE
    steps = json.loads(path.read_text()) if path.exists() else {}
    if str(step) not in steps:
        steps[str(step)] = time.time()
        write_json(path, steps)
    return float(steps[str(step)])


class CanaryPromoteOperator(_CanaryTask):
    """Every step held (or there was no champion to canary against): the candidate becomes champion.

    It runs after a skipped start too (trigger rule none_failed), so it checks why: only "no
    champion yet" promotes; a start skipped by a rejected approval promotes nothing.

    Parameters as CanaryStartOperator's, plus `gate_task_id` (the gate's decision: nothing moves
    when the champion changed since the gate compared against it) and `approval_task_id` (with
    `register.approval: required`, the answer that must be Approve).
    """

    def __init__(
        self, *, gate_task_id: str = "gate", approval_task_id: str = "approve", **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.gate_task_id = gate_task_id
        self.approval_task_id = approval_task_id

    def _refuse_without_canary(self, context: Context, hook: Any, version: str) -> None:
        """Raise a skip unless promoting without a canary is right: approved, and no other champion."""
        from airflow.sdk.exceptions import AirflowSkipException

        from airflow_trainpipe.registry.reads import current_champion

        if self.config.registration.approval == "required":
            answer = context["ti"].xcom_pull(task_ids=self.approval_task_id) or {}
            if answer.get("chosen_options") != ["Approve"]:
                raise AirflowSkipException(f"version {version} was not approved: nothing is promoted")
        holder = hook.call(
            current_champion, self.config.registered_model_name, self.config.registration.alias
        )
        if holder is not None and holder[0] != version:
            raise AirflowSkipException(
                f"the canary of version {version} did not run: @{self.config.registration.alias} stays on version {holder[0]}"
            )

    def execute(self, context: Context) -> dict[str, Any]:
        from airflow.sdk.exceptions import AirflowFailException

        from airflow_trainpipe.contracts.payloads import GateDecision, read_payload
        from airflow_trainpipe.hooks.mlflow import MlflowHook
        from airflow_trainpipe.registry.versions import ChampionChanged, promote_after_canary

        staged = self._staged(context)
        started = self._started(context)
        decision = read_payload(
            GateDecision,
            context["ti"].xcom_pull(task_ids=self.gate_task_id),
            f"the XCom of task {self.gate_task_id!r}",
        )
        hook = MlflowHook(self.mlflow_conn_id)
        name, version = staged["model_name"], staged["version"]
        if not started:
            self._refuse_without_canary(context, hook, version)
        try:
            moved = promote_after_canary(
                hook, self.config, (name, version, staged["mlflow_run_id"]), decision, self.log, bool(started)
            )
        except ChampionChanged as exc:  # a stale comparison: no retry can make it fresh
            raise AirflowFailException(str(exc)) from exc
        if started:
            _serving(self.config, version).promote()
            _report(context, self, self.config, started, "promoted", [])
        return {**staged, **moved}
