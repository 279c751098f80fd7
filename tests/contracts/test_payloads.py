"""payloads: what tasks hand each other: JSON-safe on write, validated and named on read."""

from __future__ import annotations

import math
from typing import Any

import pytest

from airflow_trainpipe.contracts.manifest import Manifest
from airflow_trainpipe.contracts.payloads import (
    Evaluation,
    GateDecision,
    TrainTiming,
    ValidationSummary,
    read_payload,
)
from airflow_trainpipe.core.digest import combine
from airflow_trainpipe.core.exceptions import PayloadError

SHAS = ["a" * 64, "b" * 64]


def _manifest(digest: str | None = None) -> dict[str, Any]:
    files = [
        {"uri": f"file:///d/ds=1/part-{i}.parquet", "size": 10, "sha256": sha, "rows": 50}
        for i, sha in enumerate(SHAS)
    ]
    return {
        "partition_uri": "file:///d/ds=1",
        "format": "parquet",
        "files": files,
        "rows": 100,
        "columns": {"amount": "double"},
        "digest": digest or combine(SHAS),
    }


def _summary(**changes: Any) -> dict[str, Any]:
    outcome = {
        "kind": "volume",
        "name": "min_rows",
        "column": None,
        "passed": False,
        "observed": 100,
        "expected": {"min": 1000},
        "message": "100 rows, fewer than 1000",
    }
    return {
        "passed": False,
        "manifest": _manifest(),
        "reference": None,
        "drift": {"amount": 0.31},
        "failures": [outcome],
        "report_uri": "file:///d/_trainpipe/report.json",
        **changes,
    }


def _timing(**changes: float) -> TrainTiming:
    values: dict[str, Any] = {"steps": 10, "loop_s": 1.5, "train_s": 2.0, "checkpoint_s": 0.1, "eval_s": 0.2}
    return TrainTiming(**{**values, "data_wait_s": 0.0, **changes})


def test_non_finite_numbers_travel_as_strings_and_come_back_as_floats() -> None:
    plain = _timing(loop_s=math.nan, train_s=math.inf, checkpoint_s=-math.inf).to_xcom()
    assert (plain["loop_s"], plain["train_s"], plain["checkpoint_s"]) == ("NaN", "Infinity", "-Infinity")
    back = read_payload(TrainTiming, plain, "train")
    assert math.isnan(back.loop_s) and back.train_s == math.inf and back.checkpoint_s == -math.inf


def test_a_payload_survives_the_round_trip_through_xcom() -> None:
    evaluation = Evaluation(holdout_rows=200, candidate={"roc_auc": 0.91}, champion={"roc_auc": 0.9})
    assert read_payload(Evaluation, evaluation.to_xcom(), "train") == evaluation


def test_a_missing_field_names_the_source_the_payload_and_the_field() -> None:
    raw = _timing().to_xcom()
    del raw["eval_s"]
    with pytest.raises(PayloadError, match=r"^train is not a TrainTiming: eval_s: Field required$"):
        read_payload(TrainTiming, raw, "train")


def test_further_problems_are_counted() -> None:
    with pytest.raises(PayloadError) as caught:
        read_payload(TrainTiming, {"steps": 1}, "the job's result event")
    assert str(caught.value) == (
        "the job's result event is not a TrainTiming: loop_s: Field required (and 4 more problem(s))"
    )


def test_something_that_is_no_mapping_is_located_at_the_payload() -> None:
    with pytest.raises(
        PayloadError, match=r"^gate is not a GateDecision: <payload>: Input should be a valid dict"
    ):
        read_payload(GateDecision, None, "gate")


def test_nested_problems_are_located_with_a_dotted_path() -> None:
    raw = _summary(failures=[{"kind": "drift"}])
    with pytest.raises(PayloadError, match=r"^validate_data is not a ValidationSummary: failures\.0\.name: "):
        read_payload(ValidationSummary, raw, "validate_data")


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(PayloadError, match=r"stopped: Extra inputs are not permitted"):
        read_payload(TrainTiming, {**_timing().to_xcom(), "stopped": True}, "train")


def test_a_summary_exposes_the_digest_and_rows_of_its_manifest() -> None:
    summary = read_payload(ValidationSummary, _summary(), "validate_data")
    assert (summary.digest, summary.rows) == (combine(SHAS), 100)
    assert summary.manifest == Manifest.model_validate(_manifest())
    plain = summary.to_xcom()
    assert (plain["digest"], plain["rows"]) == (combine(SHAS), 100)


def test_a_dumped_summary_reads_back_though_it_carries_derived_fields() -> None:
    summary = ValidationSummary.model_validate(_summary())
    assert ValidationSummary.model_validate(summary.to_xcom()) == summary


def test_a_summary_whose_manifest_does_not_hash_to_its_digest_is_refused() -> None:
    forged = "sha256:" + "0" * 64
    with pytest.raises(PayloadError) as caught:
        read_payload(ValidationSummary, _summary(manifest=_manifest(forged)), "validate_data")
    assert f"manifest {forged} does not hash to its digest" in str(caught.value)


def test_check_outcomes_carry_any_observed_and_expected_values() -> None:
    outcome = ValidationSummary.model_validate(_summary()).failures[0]
    assert (outcome.observed, outcome.expected) == (100, {"min": 1000})


def test_a_gate_decision_can_be_amended_and_dumps_json_safe() -> None:
    decision = GateDecision(
        promote=False,
        reason="no gain",
        metric="roc_auc",
        direction="maximize",
        candidate=math.nan,
        champion=0.9,
    )
    decision.model_name = "fraud"
    plain = decision.as_dict()
    assert (plain["candidate"], plain["model_name"], plain["guardrails"]) == ("NaN", "fraud", [])
    assert (plain["min_improvement"], plain["forced"], plain["fail"]) == (0.0, False, False)


def test_other_payloads_are_immutable() -> None:
    timing = _timing()
    with pytest.raises(ValueError, match="frozen"):
        timing.steps = 11  # type: ignore[misc]
