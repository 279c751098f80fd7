"""Parse-time code must not import heavy libraries: each costs seconds per DAG-processor parse."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from tests.conftest import EXAMPLE_CONFIGS

HEAVY = (
    "torch",
    "deepspeed",
    "mlflow",
    "great_expectations",
    "pandas",
    "optuna",
    "deltalake",
    "pyiceberg",
    "pyspark",
    "feast",
    "openlineage",  # the client: only the provider's listener imports it, inside a task
)


# A probe runs its code and answers with `sys.modules`. Most run as a fork of one parent that
# imported what the DAG processor has imported before it parses a DAG file (Airflow's task SDK,
# pydantic, yaml: `_PARSER`), so each pays its own imports and not Airflow's ~1 s again; a probe
# that checks Airflow itself stays out (`fresh`) runs in a fresh interpreter (~1.3 s, one core).
# Probes are started two at a time when the module's first test runs (`_probe_provider_modules`),
# and every test reads its own probe's answer.
_PROBES = ThreadPoolExecutor(max_workers=2)
_probed: dict[tuple[str, bool], Future[set[str]]] = {}
_PARSER = r"""
import json, os, sys
import airflow.sdk, pydantic, yaml
for line in sys.stdin:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(compile(json.loads(line), "<probe>", "exec"), {"__name__": "__probe__"})
            answer = {"modules": sorted(sys.modules)}
        except BaseException as error:
            answer = {"error": f"{type(error).__name__}: {error}"}
        with os.fdopen(write, "w") as out:
            json.dump(answer, out)
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    print(text, flush=True)
"""
_parser: dict[str, subprocess.Popen[str]] = {}
_parser_lock = threading.Lock()


def _run_probe(code: str, fresh: bool) -> set[str]:
    if fresh:
        probe = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
        out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
        return set(json.loads(out.splitlines()[-1]))
    with _parser_lock:  # one probe at a time through the parent's pipes
        if "process" not in _parser:
            _parser["process"] = subprocess.Popen(
                [sys.executable, "-c", _PARSER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
            )
        parent = _parser["process"]
        assert parent.stdin is not None and parent.stdout is not None
        parent.stdin.write(json.dumps(code) + "\n")
        parent.stdin.flush()
        answer = json.loads(parent.stdout.readline())
    assert "error" not in answer, f"the probe failed: {answer['error']}\n{code}"
    return set(answer["modules"])


def _submit(code: str, fresh: bool) -> Future[set[str]]:
    if (code, fresh) not in _probed:
        _probed[code, fresh] = _PROBES.submit(_run_probe, code, fresh)
    return _probed[code, fresh]


def _modules_after(code: str, fresh: bool = False) -> set[str]:
    """The modules loaded after `code` ran in the parser's parent; `fresh`: in a new interpreter,
    for a probe that checks that Airflow itself is not imported."""
    return _submit(code, fresh).result()


def _heavy(modules: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in roots)


@pytest.mark.parametrize("fresh", [False, True], ids=["parser", "fresh"])
def test_the_probe_sees_a_heavy_import(fresh: bool) -> None:
    # Guards the guard: if the probe could not see imports, the tests below would pass vacuously.
    assert _heavy(_modules_after("import pandas", fresh), HEAVY)


def test_loading_configs_imports_no_heavy_library() -> None:
    modules = _modules_after(
        "from airflow_trainpipe.config import load_config\n"
        f"for name in ('fraud_detector.yaml', 'house_prices.yaml'): load_config({str(EXAMPLE_CONFIGS)!r} + '/' + name)"
    )
    assert _heavy(modules, HEAVY) == []


def test_check_cli_imports_neither_heavy_libraries_nor_airflow() -> None:
    modules = _modules_after(
        f"from airflow_trainpipe.cli import main\nassert main(['check', {str(EXAMPLE_CONFIGS)!r}]) == 0",
        fresh=True,
    )
    assert _heavy(modules, (*HEAVY, "airflow")) == []


def test_provider_info_is_light() -> None:
    modules = _modules_after(
        "from airflow_trainpipe.get_provider_info import get_provider_info; get_provider_info()", fresh=True
    )
    assert _heavy(modules, (*HEAVY, "airflow")) == []


def _provider_modules() -> list[str]:
    from airflow_trainpipe.get_provider_info import get_provider_info

    info = get_provider_info()
    return sorted(
        {
            m
            for kind in ("operators", "sensors", "hooks", "triggers")
            for entry in info.get(kind, [])
            for m in entry["python-modules"]
        }
    )


def test_every_resource_kind_is_probed() -> None:
    assert {m.split(".")[1] for m in _provider_modules()} >= {"operators", "sensors", "triggers"}


@pytest.fixture(scope="module", autouse=True)
def _probe_provider_modules() -> Iterator[None]:
    for module in _provider_modules():
        _submit(f"import {module}", fresh=False)
    yield
    if "process" in _parser:  # its loop ends with its input
        parent = _parser.pop("process")
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=30)


@pytest.mark.parametrize("module", _provider_modules())
def test_provider_modules_import_no_heavy_library(module: str) -> None:
    assert _heavy(_modules_after(f"import {module}"), HEAVY) == []


def test_manifest_builder_and_render_import_neither_kubernetes_nor_heavy_libraries() -> None:
    modules = _modules_after(
        "from airflow_trainpipe.cli import main\n"
        "import contextlib, io\n"
        f"with contextlib.redirect_stdout(io.StringIO()): assert main(['render', {str(EXAMPLE_CONFIGS / 'house_prices.yaml')!r}]) == 0",
        fresh=True,
    )
    assert _heavy(modules, (*HEAVY, "kubernetes", "airflow")) == []


def test_feature_store_client_imports_only_the_stdlib_and_its_own_package() -> None:
    # It runs on Airflow workers; Feast (and its pandas<3) lives in another interpreter.
    modules = _modules_after("import airflow_trainpipe.data.feature_store.client", fresh=True)
    assert _heavy(modules, (*HEAVY, "pyarrow", "numpy", "airflow", "pydantic")) == []


def test_operator_module_does_not_import_the_kubernetes_client() -> None:
    modules = _modules_after("import airflow_trainpipe.operators.train")
    assert _heavy(modules, ("kubernetes", "kubernetes_asyncio")) == []


def test_gate_does_not_import_matplotlib_at_parse_time() -> None:
    assert _heavy(_modules_after("import airflow_trainpipe.operators.gate"), ("matplotlib",)) == []


def test_extra_links_and_gate_rules_are_light() -> None:
    assert _heavy(_modules_after("import airflow_trainpipe.links.mlflow"), HEAVY) == []
    assert (
        _heavy(_modules_after("import airflow_trainpipe.registry.promotion", fresh=True), (*HEAVY, "airflow"))
        == []
    )


def test_the_factory_is_light() -> None:
    # Kubernetes too: the launcher's client comes in only when a kubernetes train task runs.
    assert (
        _heavy(_modules_after("import airflow_trainpipe.factory"), (*HEAVY, "kubernetes", "matplotlib")) == []
    )


@pytest.mark.parametrize("kind", ["delta", "iceberg"])
def test_a_table_source_pipeline_s_dag_is_built_without_its_reader(tmp_path, kind: str) -> None:
    """delta-rs (and its Arrow scan), pyiceberg and Airflow's Iceberg hook are the export's and
    the sensor's, at run time: a DAG file of a delta- or iceberg-source pipeline parses without
    them."""
    from tests.helpers import iceberg_lake, lake

    if kind == "delta":
        lake.delta_config(tmp_path, "lake/transactions")
    else:
        iceberg_lake.iceberg_config(tmp_path)
    modules = _modules_after(
        "from airflow_trainpipe.factory import build_pipeline_dags\n"
        "from pathlib import Path\n"
        f"(dag,) = build_pipeline_dags(Path({str(tmp_path)!r}))\n"
        f"assert dag.task_dict['wait_for_data'].data.source.kind == {kind!r}, dag.task_dict\n"
    )
    assert _heavy(modules, HEAVY) == []
    assert "airflow.providers.apache.iceberg.hooks.iceberg" not in modules
