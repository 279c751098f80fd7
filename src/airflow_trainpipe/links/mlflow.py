"""Extra links from Airflow tasks to the MLflow UI.

The Airflow 3 task runner resolves extra links on the worker, right after the task and in the
same process: `finalize()` calls `get_link(operator=ti.task, ...)` on the very operator object
whose `execute()` ran (`context["task"]`) and stores the result under the link's `xcom_key`
(`_link_<class>`), which is all the UI reads. So the operator keeps the URL it learned
(`persist`) on itself, and `get_link` reads it back: no intermediate XCom to write and read
again. (Reading one that was never pushed, as the amazon provider's links do when nothing was
persisted, makes the task SDK's client log `[error] XCom not found` in a green task.)
No UI URL (the embedded sqlite store has no server), or a task that failed before it knew one,
means no link, not a broken one and not an error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import RuntimeTaskInstanceProtocol, TaskInstanceKey


class _PersistedLink(BaseOperatorLink):
    name: ClassVar[str]
    key: ClassVar[str]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        # Keyed by the task instance too: one operator object of an in-process `dag.test()` may
        # run in several DAG runs, and a URL must never leak into another run's link.
        url, owner = getattr(operator, f"_trainpipe_link_{self.key}", (None, None))
        return url if url and owner == _owner(ti_key) else ""

    @classmethod
    def persist(cls, context: Context, url: str | None) -> None:
        # The runner executes a copy of the DAG's operator (`prepare_for_execution`); setting an
        # attribute on it, never mutating a shared one, keeps the DAG's operator untouched.
        task, ti = context.get("task"), context.get("ti")
        if task is None or ti is None:
            return  # an operator executed outside a task run (a script, a test): no task to link
        setattr(task, f"_trainpipe_link_{cls.key}", (url, _owner(ti)))


def _owner(ti: TaskInstanceKey | RuntimeTaskInstanceProtocol) -> tuple[str, str, str, int | None]:
    return ti.dag_id, ti.task_id, ti.run_id, ti.map_index


class MlflowRunLink(_PersistedLink):
    """The train task's MLflow run."""

    name: ClassVar[str] = "MLflow run"
    key: ClassVar[str] = "mlflow_run_url"


class MlflowModelVersionLink(_PersistedLink):
    """The model version the register task created (or found)."""

    name: ClassVar[str] = "MLflow model version"
    key: ClassVar[str] = "mlflow_model_version_url"


class CanaryReportLink(_PersistedLink):
    """The canary's HTML report (registry/canary_report.py) on the version's run."""

    name: ClassVar[str] = "Canary report"
    key: ClassVar[str] = "canary_report_url"


class GateReportLink(_PersistedLink):
    """The gate's HTML report (registry/gate_report.py) on the candidate's run, in MLflow's artifact viewer."""

    name: ClassVar[str] = "Gate report"
    key: ClassVar[str] = "gate_report_url"
