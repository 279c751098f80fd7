"""The MLflow navigation plugin of plugins/: its link comes from configuration, never hard-coded."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

PLUGIN_FILE = REPO_ROOT / "plugins" / "trainpipe_mlflow_nav.py"


@pytest.fixture(scope="module")
def nav():
    spec = importlib.util.spec_from_file_location("trainpipe_mlflow_nav", PLUGIN_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("environ", "url"),
    [
        ({}, None),
        ({"TRAINPIPE_MLFLOW_UI_URL": "https://mlflow.example.com/"}, "https://mlflow.example.com"),
        (
            {
                "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                    {
                        "conn_type": "mlflow",
                        "host": "http://127.0.0.1",
                        "port": 5123,
                        "login": "u",
                        "password": "p",
                    }
                )
            },
            "http://127.0.0.1:5123",
        ),
        (
            {
                "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                    {"conn_type": "mlflow", "host": "mlflow.internal", "schema": "mlflow"}
                )
            },
            "http://mlflow.internal/mlflow",
        ),
        (
            {
                "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                    {"conn_type": "mlflow", "host": "tracking", "extra": {"ui_url": "https://ui.example/"}}
                )
            },
            "https://ui.example",
        ),
        (
            {
                "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                    {"conn_type": "mlflow", "extra": json.dumps({"tracking_uri": "https://t.example"})}
                )
            },
            "https://t.example",
        ),
        (
            {
                "AIRFLOW_CONN_MLFLOW_DEFAULT": json.dumps(
                    {"conn_type": "mlflow", "extra": {"tracking_uri": "sqlite:////data/mlflow.db"}}
                )
            },
            None,
        ),
        (
            {
                "AIRFLOW_CONN_MLFLOW_DEFAULT": "mlflow://mlflow.internal:5000/prefix?ui_url=https%3A%2F%2Fui.example"
            },
            "https://ui.example",
        ),
        (
            {"AIRFLOW_CONN_MLFLOW_DEFAULT": "mlflow://mlflow.internal:5000/prefix"},
            "http://mlflow.internal:5000/prefix",
        ),
    ],
)
def test_ui_url_from_configuration(nav, environ: dict[str, str], url: str | None) -> None:
    assert nav.mlflow_ui_url(environ) == url
    views = nav.mlflow_external_views(environ)
    assert views == (
        [] if url is None else [{"name": "MLflow", "href": url, "destination": "nav", "category": "browse"}]
    )


def test_airflow_loads_the_plugin_from_the_plugins_folder(tmp_path) -> None:
    """Airflow's plugin manager finds it in the plugins folder; the api-server's response model accepts it.
    No `url_route`: the menu entry opens MLflow itself instead of embedding it in an iframe."""
    code = (
        "from airflow import plugins_manager as pm\n"
        "from airflow.api_fastapi.core_api.datamodels.plugins import PluginResponse\n"
        "info = [PluginResponse.model_validate(p) for p in pm.get_plugin_info()]\n"
        "print([(p.name, [(v.name, v.href, v.destination) for v in p.external_views]) for p in info"
        " if p.name != 'OpenLineageProviderPlugin'])\n"  # the [openlineage] extra's own plugin
    )
    env = {
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGIN_FILE.parent),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "TRAINPIPE_MLFLOW_UI_URL": "http://127.0.0.1:5999",
        "PATH": "/usr/bin:/bin",
    }
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        done.stdout.strip().splitlines()[-1]
        == "[('trainpipe_mlflow_nav', [('MLflow', 'http://127.0.0.1:5999', 'nav')])]"
    )
