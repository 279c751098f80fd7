"""`make demo`'s day summary says what the validation report says."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO_ROOT


def _demo():
    spec = importlib.util.spec_from_file_location("trainpipe_demo", REPO_ROOT / "scripts" / "demo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _day(validated: dict) -> dict:
    return {
        "run_id": "r",
        "state": "success",
        "tasks": {"validate_data": "success"},
        "xcom": {"validate_data": validated},
    }


def test_a_report_with_failed_checks_is_never_all_checks_passed(capsys: pytest.CaptureFixture[str]) -> None:
    # validation.fail_on: never lets the run go on; the XCom exists, the checks still failed.
    failure = {
        "kind": "drift",
        "name": "psi",
        "message": "amount: psi 6.8400 vs ds=2026-01-02 (threshold 0.25)",
        "expected": "<= 0.25",
    }
    _demo()._print_day(
        _day({"passed": False, "digest": "sha256:" + "a" * 64, "rows": 20000, "failures": [failure]}), 1.0
    )
    out = capsys.readouterr().out
    assert "all checks passed" not in out
    assert (
        "1 check(s) FAILED (validation.fail_on is never: training went on)" in out
        and "amount: psi 6.8400" in out
    )


def test_a_clean_report_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    _demo()._print_day(
        _day({"passed": True, "digest": "sha256:" + "a" * 64, "rows": 20000, "failures": []}), 1.0
    )
    assert "20000 rows, all checks passed" in capsys.readouterr().out


def test_the_registry_shows_each_version_against_what_its_gate_compared(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """v1's score and v2's are on different days' rows: v2 beat v1 on its own holdout, and the
    summary says so rather than printing 0.8137 above 0.7426 as if v2 were a regression."""
    import mlflow

    demo = _demo()
    monkeypatch.setattr(demo, "OUT", tmp_path)
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    client.create_registered_model("fraud_detector")
    gates = [
        {"trainpipe.champion_compared": "none", "trainpipe.gate.champion": "None"},
        {"trainpipe.champion_compared": "fraud_detector/1", "trainpipe.gate.champion": "0.6567"},
    ]
    for number, (candidate, gate) in enumerate(zip(("0.8137", "0.7426"), gates, strict=True), 1):
        tags = {"airflow.dag_run_id": f"day{number}", "trainpipe.data_digest": "sha256:" + "a" * 64}
        tags |= {"trainpipe.gate.metric": "roc_auc", "trainpipe.gate.candidate": candidate, **gate}
        client.create_model_version("fraud_detector", str(tmp_path / f"m{number}"), tags=tags)
    client.set_registered_model_alias("fraud_detector", "champion", "2")
    demo._print_registry()
    first, second = capsys.readouterr().out.splitlines()
    assert first.endswith("at its gate roc_auc 0.8137 on its run's holdout, with no champion to compare")
    assert "v2 @champion" in second
    assert second.endswith(
        "at its gate roc_auc 0.7426 against v1's 0.6567 on the same rows (its run's holdout)"
    )
