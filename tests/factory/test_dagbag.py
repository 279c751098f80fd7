"""The dags folder as the DAG processor sees it: Airflow's DagBag in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import EXAMPLE_CONFIGS, REPO_ROOT
from tests.test_import_weight import HEAVY

# Fresh process: the parse must not see modules a test imported, and it reports what it loaded.
PROBE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(sys.argv[1])
print("PROBE " + json.dumps({
    "import_errors": bag.import_errors,
    "dags": {d.dag_id: {"tags": sorted(d.tags), "description": d.description, "doc_md": d.doc_md,
                        "tasks": sorted(d.task_ids), "fileloc": d.fileloc} for d in bag.dags.values()},
    "modules": sorted(sys.modules),
}))
"""


def _parse(dags_folder: Path, tmp_path: Path) -> dict:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "airflow"), "TRAINPIPE_CONFIG_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", PROBE, str(dags_folder)], env=env, check=True, capture_output=True, text=True, timeout=300).stdout
    return json.loads(out.split("PROBE ", 1)[1])


def _heavy(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_the_repository_dags_folder_parses_without_heavy_imports(tmp_path: Path) -> None:
    parsed = _parse(REPO_ROOT / "dags", tmp_path)
    assert parsed["import_errors"] == {}
    assert sorted(parsed["dags"]) == ["fraud_detector", "house_prices"]
    assert _heavy(parsed["modules"]) == []
    # The probe can see a heavy import: a loader file that pulls pandas in is caught.
    (tmp_path / "dags").mkdir()
    shutil.copytree(REPO_ROOT / "dags" / "configs", tmp_path / "dags" / "configs")
    loader = (REPO_ROOT / "dags" / "trainpipe_pipelines.py").read_text()
    (tmp_path / "dags" / "trainpipe_pipelines.py").write_text("import pandas\n" + loader)
    assert _heavy(_parse(tmp_path / "dags", tmp_path)["modules"]) != []


def test_one_hundred_pipelines_and_two_broken_configs(tmp_path: Path) -> None:
    dags = tmp_path / "dags"
    (dags / "configs").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "dags" / "trainpipe_pipelines.py", dags)
    text = (EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text()
    for i in range(100):
        (dags / "configs" / f"pipeline_{i:03d}.yaml").write_text(
            text.replace("pipeline: fraud_detector", f"pipeline: pipeline_{i:03d}").replace("model_name: fraud_detector", f"model_name: pipeline_{i:03d}"))
    (dags / "configs" / "typo_metric.yaml").write_text(
        text.replace("pipeline: fraud_detector", "pipeline: typo_metric").replace("metric: roc_auc", "metric: roc_acu"))
    (dags / "configs" / "bad_indent.yaml").write_text(text.replace("  label: is_fraud", " label: is_fraud"))

    parsed = _parse(dags, tmp_path)
    assert parsed["import_errors"] == {}
    pipelines = {k: v for k, v in parsed["dags"].items() if "trainpipe:broken-config" not in v["tags"]}
    broken = {k: v for k, v in parsed["dags"].items() if "trainpipe:broken-config" in v["tags"]}
    assert len(pipelines) == 100
    assert all(v["tasks"] == ["gate", "register", "train", "validate_data", "wait_for_data"] for v in pipelines.values())
    assert sorted(broken) == ["broken_config__bad_indent", "typo_metric"]
    typo = broken["typo_metric"]
    assert typo["description"].startswith("BROKEN CONFIG configs/typo_metric.yaml: gate.metric: 'roc_acu' is not a binary_classification metric")
    assert "configs/typo_metric.yaml:" in typo["doc_md"]
    indent = broken["broken_config__bad_indent"]
    assert indent["description"].startswith("BROKEN CONFIG configs/bad_indent.yaml: <document>: invalid YAML")
    assert "configs/bad_indent.yaml:" in indent["doc_md"]
    assert _heavy(parsed["modules"]) == []
