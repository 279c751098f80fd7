"""openlineage.reporting: the provider's protocol on every operator of ours. (That parsing imports
none of OpenLineage, installed or not, is tests/test_import_weight.py's: `openlineage` is heavy.)"""

from __future__ import annotations

import pytest

from tests.conftest import EXAMPLE_CONFIGS


def test_every_task_answers_the_provider_and_reports_nothing_before_it_ran() -> None:
    pytest.importorskip("airflow.providers.openlineage")
    from airflow_trainpipe.operators.gate import BaselineGateOperator
    from airflow_trainpipe.operators.register import RegisterModelOperator
    from airflow_trainpipe.operators.validate import DataValidateOperator

    config = str(EXAMPLE_CONFIGS / "fraud_detector.yaml")
    for operator in (
        DataValidateOperator(task_id="validate_data", config=config),
        BaselineGateOperator(task_id="gate", config=config),
        RegisterModelOperator(task_id="register", config=config),
    ):
        for lineage in (
            operator.get_openlineage_facets_on_start(),
            operator.get_openlineage_facets_on_complete(None),
            operator.get_openlineage_facets_on_failure(None),
        ):
            assert (lineage.inputs, lineage.outputs, lineage.run_facets) == ([], [], {})
