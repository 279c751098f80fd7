"""ConfigErrorOperator: the only task of a broken config's stand-in DAG."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.core.retry_policy import TrainpipeRetryPolicyMixin

if TYPE_CHECKING:
    from airflow.sdk import Context


class ConfigErrorOperator(TrainpipeRetryPolicyMixin, BaseOperator):
    """Fails, without retries, with the problems of a pipeline config that does not parse.

    :param config_file: the config file, as shown to users (relative to the dags folder).
    :param problems: one located message per problem (`file:line:column: field: message`).
    """

    template_fields: Sequence[str] = ()
    ui_color = "#f5b7b1"

    def __init__(self, *, config_file: str, problems: list[str], **kwargs: Any) -> None:
        kwargs.setdefault("retries", 0)
        super().__init__(**kwargs)
        self.config_file = config_file
        self.problems = problems

    def execute(self, context: Context) -> None:
        raise AirflowFailException(
            f"pipeline config {self.config_file} is invalid; fix it and the DAG "
            "processor reloads it:\n" + "\n".join(self.problems)
        )
