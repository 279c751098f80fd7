from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_trainpipe.operators.config_error import ConfigErrorOperator


def test_fails_without_retries_naming_the_file_and_every_problem() -> None:
    task = ConfigErrorOperator(
        task_id="config_error",
        config_file="configs/x.yaml",
        problems=["configs/x.yaml:3:9: gate.metric: nope", "configs/x.yaml:9:1: data: missing"],
    )
    assert task.retries == 0
    with pytest.raises(AirflowFailException) as failure:
        task.execute({})
    assert "configs/x.yaml is invalid" in str(failure.value)
    assert "gate.metric: nope" in str(failure.value) and "data: missing" in str(failure.value)
