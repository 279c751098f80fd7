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


def test_the_same_task_reports_its_datasets_once_it_ran() -> None:
    # The counterpart of the test above, which an operator reporting nothing ever would also pass:
    # given what its execute() left (the register task's returned payload), the same protocol
    # reports the run's model in and the model version out, on start nothing, on failure the same.
    pytest.importorskip("airflow.providers.openlineage")
    from airflow_trainpipe.operators.register import RegisterModelOperator

    operator = RegisterModelOperator(task_id="register", config=str(EXAMPLE_CONFIGS / "fraud_detector.yaml"))
    operator._lineage_registered = {
        "model_name": "fraud_detector",
        "version": "3",
        "mlflow_run_id": "0123abcd",
        "data_digest": "sha256:" + "ab" * 32,
        "model_uri": "models:/fraud_detector/3",
    }
    operator._lineage_tracking_uri = "http://127.0.0.1:5000"
    lineage = operator.get_openlineage_facets_on_complete(None)
    model_in, snapshot_in = lineage.inputs
    assert (model_in.namespace, model_in.name) == ("http://127.0.0.1:5000", "runs/0123abcd/model")
    assert snapshot_in.name.endswith(f"/snapshots/{'ab' * 32}.json")
    [version] = lineage.outputs
    assert version.name == "models/fraud_detector/versions/3"
    assert version.facets["trainpipe_model"].mlflowRunId == "0123abcd"
    assert operator.get_openlineage_facets_on_failure(None).outputs == lineage.outputs
    assert operator.get_openlineage_facets_on_start().outputs == []
