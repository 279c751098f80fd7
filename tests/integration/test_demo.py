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
