"""Parse-time code must not import heavy libraries: each costs seconds per DAG-processor parse."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import EXAMPLE_CONFIGS

HEAVY = ("torch", "deepspeed", "mlflow", "great_expectations", "pandas")


def _modules_after(code: str) -> set[str]:
    probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out.splitlines()[-1]))


def _heavy(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in roots)


def test_the_probe_sees_a_heavy_import() -> None:
    # Guards the guard: if the probe could not see imports, the tests below would pass vacuously.
    assert _heavy(_modules_after("import pandas"), HEAVY)


def test_loading_configs_imports_no_heavy_library() -> None:
    modules = _modules_after(
        "from airflow_trainpipe.config import load_config\n"
        f"for name in ('fraud_detector.yaml', 'house_prices.yaml'): load_config({str(EXAMPLE_CONFIGS)!r} + '/' + name)"
    )
    assert _heavy(modules, HEAVY) == []


def test_check_cli_imports_neither_heavy_libraries_nor_airflow() -> None:
    modules = _modules_after(
        "from airflow_trainpipe.cli import main\n"
        f"assert main(['check', {str(EXAMPLE_CONFIGS)!r}]) == 0"
    )
    assert _heavy(modules, (*HEAVY, "airflow")) == []


def test_provider_info_is_light() -> None:
    modules = _modules_after("from airflow_trainpipe.get_provider_info import get_provider_info; get_provider_info()")
    assert _heavy(modules, (*HEAVY, "airflow")) == []


def test_operator_modules_import_no_heavy_library() -> None:
    modules = _modules_after(
        "import airflow_trainpipe.operators.train, airflow_trainpipe.operators.gate, airflow_trainpipe.operators.register"
    )
    assert _heavy(modules, (*HEAVY, "matplotlib")) == []


def test_hook_links_and_gate_rules_import_no_heavy_library() -> None:
    modules = _modules_after("import airflow_trainpipe.hooks.mlflow, airflow_trainpipe.links.mlflow")
    assert _heavy(modules, HEAVY) == []
    assert _heavy(_modules_after("import airflow_trainpipe.promotion"), (*HEAVY, "airflow")) == []
