"""`trainpipe` command line: check, schema, --version."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import airflow_trainpipe
from airflow_trainpipe.cli import main
from tests.conftest import EXAMPLE_CONFIGS


def test_check_example_configs_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(EXAMPLE_CONFIGS)]) == 0
    assert "2 config(s) ok" in capsys.readouterr().err


def test_check_reports_duplicate_pipeline_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", tmp_path / "a.yaml")
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", tmp_path / "b.yml")
    assert main(["check", str(tmp_path)]) == 1
    assert f"{tmp_path / 'b.yml'}: pipeline: 'fraud_detector' is already defined by {tmp_path / 'a.yaml'}" in capsys.readouterr().out


def test_check_missing_path_and_empty_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", str(tmp_path / "nope.yaml")]) == 1
    assert "no such file" in capsys.readouterr().err
    assert main(["check", str(tmp_path)]) == 1
    assert "no *.yaml or *.yml config files" in capsys.readouterr().err


def test_check_mixes_good_and_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", tmp_path / "good.yaml")
    (tmp_path / "bad.yaml").write_text((EXAMPLE_CONFIGS / "house_prices.yaml").read_text().replace("zero_stage: 2", "zero_stage: 5"))
    assert main(["check", "-v", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'good.yaml'}: ok (fraud_detector)" in out
    assert f"{tmp_path / 'bad.yaml'}:" in out and "training.deepspeed.zero_stage" in out


def test_schema_prints_json_schema(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "airflow-trainpipe pipeline config"
    assert set(schema["required"]) == {"pipeline", "schedule", "data", "training", "gate"}


def test_console_script_version() -> None:
    script = Path(sys.executable).parent / "trainpipe"
    out = subprocess.run([str(script), "--version"], check=True, capture_output=True, text=True).stdout
    assert out.strip() == f"trainpipe {airflow_trainpipe.__version__}"
