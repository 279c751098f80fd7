"""The trigger form's Params as the Airflow 3.3 UI reads them: the defaults must be submittable.

The React trigger form counts a Param as required when its schema has a `type` that is not a
list containing "null", and keeps Trigger disabled while a required field is null, undefined or
"" (apache-airflow-core 3.3.2, airflow/ui/dist/assets/index-*.js: `isRequired` from
`ui/src/components/FlexibleForm/isParamRequired.tsx` and the section check of `FlexibleForm.tsx`).
tests/integration/test_ui_browser.py clicks that button in a real browser; this checks the same rule on the
Params every example pipeline serves to the form, without one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from airflow.serialization.serialized_objects import DagSerialization

from airflow_trainpipe.factory import build_pipeline_dags
from tests.conftest import EXAMPLE_CONFIGS


@pytest.fixture
def dags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list:
    monkeypatch.setenv("TRAINPIPE_CONFIG_CACHE", str(tmp_path / "cache"))
    dags = build_pipeline_dags(EXAMPLE_CONFIGS, EXAMPLE_CONFIGS.parent)
    assert {dag.dag_id for dag in dags} == {
        "fraud_detector",
        "fraud_detector_canary",
        "fraud_detector_delta",
        "fraud_detector_features",
        "fraud_detector_iceberg",
        "fraud_detector_sql",
        "fraud_detector_tuned",
        "house_prices",
        "search_ranking",
        "support_tickets",
        "support_tickets_finetune",
    }
    return dags


def _ui_required(schema: dict) -> bool:
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def test_form_defaults_do_not_block_the_trigger_button(dags: list) -> None:
    blocking = []
    for dag in dags:
        # What the REST API gives the form: `dump()` of each Param of the DAG as the DAG processor stored it.
        stored = DagSerialization.from_dict(DagSerialization.to_dict(dag))
        for name, param in stored.params.items():
            spec = param.dump()
            if _ui_required(spec["schema"]) and spec["value"] in (None, ""):
                blocking.append(
                    f"{dag.dag_id}.{name}: required by the form but empty by default ({spec['schema']})"
                )
    assert blocking == []


def test_form_defaults_are_valid(dags: list) -> None:
    # Trigger with the defaults sends them as the run's conf; the API validates them against the schemas.
    for dag in dags:
        dag.params.validate()


def test_a_windowed_pipeline_says_where_its_window_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAINPIPE_CONFIG_CACHE", str(tmp_path / "cache"))
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "fraud_detector.yaml").write_text(
        text.replace(
            "  format: parquet\n", "  format: parquet\n  window: {partitions: 30, min_partitions: 27}\n"
        )
    )
    (dag,) = build_pipeline_dags(tmp_path / "configs", tmp_path)
    assert dag.params.get_param("partition").description.endswith("The window of 30 partitions ends there.")
    assert "a window of the last 30 (at least 27 present)" in dag.doc_md
