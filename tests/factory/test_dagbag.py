"""The dags folder as the DAG processor sees it: Airflow's DagBag in a fresh process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.config.test_hostile_configs import HOSTILE, HOSTILE_DIR, generated_cases, make_generated
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
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "TRAINPIPE_CONFIG_CACHE": str(tmp_path / "cache"),
    }
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(dags_folder)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    return json.loads(out.split("PROBE ", 1)[1])


def _heavy(modules: list[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY)


def test_the_repository_dags_folder_parses_without_heavy_imports(tmp_path: Path) -> None:
    parsed = _parse(REPO_ROOT / "dags", tmp_path)
    assert parsed["import_errors"] == {}
    assert sorted(parsed["dags"]) == [
        "fraud_detector", "fraud_detector_canary", "fraud_detector_delta", "fraud_detector_features",
        "fraud_detector_iceberg", "fraud_detector_sql", "fraud_detector_tuned",
        "house_prices", "search_ranking", "support_tickets", "support_tickets_finetune",
    ]  # fmt: skip
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
            text.replace("pipeline: fraud_detector", f"pipeline: pipeline_{i:03d}").replace(
                "model_name: fraud_detector", f"model_name: pipeline_{i:03d}"
            )
        )
    (dags / "configs" / "typo_metric.yaml").write_text(
        text.replace("pipeline: fraud_detector", "pipeline: typo_metric").replace(
            "metric: roc_auc", "metric: roc_acu"
        )
    )
    (dags / "configs" / "bad_indent.yaml").write_text(text.replace("  label: is_fraud", " label: is_fraud"))

    parsed = _parse(dags, tmp_path)
    assert parsed["import_errors"] == {}
    pipelines = {k: v for k, v in parsed["dags"].items() if "trainpipe:broken-config" not in v["tags"]}
    broken = {k: v for k, v in parsed["dags"].items() if "trainpipe:broken-config" in v["tags"]}
    assert len(pipelines) == 100
    assert all(
        v["tasks"] == ["gate", "register", "train", "validate_data", "wait_for_data"]
        for v in pipelines.values()
    )
    assert sorted(broken) == ["broken_config__bad_indent", "typo_metric"]
    typo = broken["typo_metric"]
    assert typo["description"].startswith(
        "BROKEN CONFIG configs/typo_metric.yaml: gate.metric: 'roc_acu' is not a binary_classification metric"
    )
    assert "configs/typo_metric.yaml:" in typo["doc_md"]
    indent = broken["broken_config__bad_indent"]
    assert indent["description"].startswith("BROKEN CONFIG configs/bad_indent.yaml: <document>: invalid YAML")
    assert "configs/bad_indent.yaml:" in indent["doc_md"]
    assert _heavy(parsed["modules"]) == []


# One fresh process loads one dags folder per hostile case, then one folder holding them all.
BATCH_PROBE = """
import json, sys, time
from airflow.dag_processing.dagbag import DagBag
for folder in sys.argv[1:]:
    print("START " + folder, flush=True)
    started = time.perf_counter()
    bag = DagBag(folder)
    print("BAG " + json.dumps({"folder": folder, "seconds": time.perf_counter() - started,
                               "import_errors": bag.import_errors,
                               "dags": {d.dag_id: {"tags": sorted(d.tags), "description": d.description} for d in bag.dags.values()}}), flush=True)
print("MODULES " + json.dumps(sorted(sys.modules)))
"""


def _case_folder(root: Path, case: str) -> Path:
    dags = root / case / "dags"
    (dags / "configs").mkdir(parents=True)
    shutil.copy(REPO_ROOT / "dags" / "trainpipe_pipelines.py", dags)
    shutil.copy(EXAMPLE_CONFIGS / "fraud_detector.yaml", dags / "configs")
    return dags


def _batch(folders: list[Path], tmp_path: Path) -> tuple[dict[str, dict], list[str]]:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "TRAINPIPE_CONFIG_CACHE": str(tmp_path / "cache"),
    }
    done = subprocess.run(
        [sys.executable, "-c", BATCH_PROBE, *map(str, folders)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stdout.splitlines()
    started = [line.split(" ", 1)[1] for line in lines if line.startswith("START ")]
    assert done.returncode == 0, (
        f"the DagBag process died ({done.returncode}) while loading {started[-1:]}:\n{done.stderr[-2000:]}"
    )
    bags = {(bag := json.loads(line[4:]))["folder"]: bag for line in lines if line.startswith("BAG ")}
    return bags, json.loads(next(line for line in lines if line.startswith("MODULES "))[8:])


@pytest.mark.timeout(300)
def test_each_hostile_config_beside_a_valid_one_is_a_stand_in(tmp_path: Path) -> None:
    cases: dict[
        str, tuple[Path, str, str]
    ] = {}  # case -> (dags folder, file as shown, what its stand-in says)
    for name, expected in HOSTILE.items():
        dags = _case_folder(tmp_path, name)
        shutil.copy(HOSTILE_DIR / name, dags / "configs")
        cases[name] = (dags, name, expected)
    for shown, (write, expected) in generated_cases().items():
        dags = _case_folder(tmp_path, f"generated_{len(cases)}")
        write(dags / "configs")
        cases[f"generated {shown[:60]}"] = (dags, shown, expected)
    every = _case_folder(tmp_path, "every")  # all of them at once, timed
    for path in HOSTILE_DIR.iterdir():
        shutil.copy(path, every / "configs")
    make_generated(every / "configs")
    generated = {shown: expected for shown, (_, expected) in generated_cases().items()}
    cases |= {
        f"every: {shown[:60]}": (every, shown, expected)
        for shown, expected in {**HOSTILE, **generated}.items()
    }

    bags, modules = _batch(sorted({dags for dags, _, _ in cases.values()}), tmp_path)
    failures = []
    for case, (dags, shown, expected) in cases.items():
        bag = bags[str(dags)]
        valid = bag["dags"].get("fraud_detector", {})
        stand_ins = [
            d
            for d in bag["dags"].values()
            if d["description"] and d["description"].startswith(f"BROKEN CONFIG configs/{shown}: ")
        ]
        if bag["import_errors"]:
            failures.append(f"{case}: import errors {bag['import_errors']}")
        if "trainpipe:broken-config" in valid.get("tags", ["missing"]):
            failures.append(f"{case}: the valid pipeline fraud_detector did not load: {valid}")
        if len(stand_ins) != 1 or expected not in stand_ins[0]["description"]:
            failures.append(
                f"{case}: expected one stand-in for configs/{shown} saying {expected!r}, got {[d['description'][:300] for d in stand_ins]}"
            )
    assert not failures, "\n".join(failures)
    assert _heavy(modules) == []
    # The DAG processor's time for a folder holding every hostile file (the valid one included).
    assert bags[str(every)]["seconds"] < 10, bags[str(every)]["seconds"]
    print(f"DagBag of every hostile file beside a valid config: {bags[str(every)]['seconds']:.2f} s")
