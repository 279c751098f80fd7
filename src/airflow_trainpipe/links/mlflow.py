"""Extra links from Airflow tasks to the MLflow UI.

Like the amazon provider's links: the operator persists the URL into an XCom while it runs
(`persist`); after the task, the task runner calls `get_link` on the worker and stores the
result under `xcom_key`, which is what the Airflow 3 UI shows. No UI URL (the embedded sqlite
store has no server) means no link, not a broken one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator, Context
    from airflow.sdk.types import TaskInstanceKey


class _PersistedLink(BaseOperatorLink):
    name: ClassVar[str]
    key: ClassVar[str]

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        from airflow.sdk.execution_time.xcom import XCom

        return XCom.get_value(ti_key=ti_key, key=self.key) or ""

    @classmethod
    def persist(cls, context: Context, url: str | None) -> None:
        if url:
            context["ti"].xcom_push(key=cls.key, value=url)


class MlflowRunLink(_PersistedLink):
    """The train task's MLflow run."""

    name: ClassVar[str] = "MLflow run"
    key: ClassVar[str] = "mlflow_run_url"


class MlflowModelVersionLink(_PersistedLink):
    """The model version the register task created (or found)."""

    name: ClassVar[str] = "MLflow model version"
    key: ClassVar[str] = "mlflow_model_version_url"
