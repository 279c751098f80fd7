"""Airflow discovers the package as a provider, and its metadata is valid."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import jsonschema

import airflow_trainpipe
from airflow_trainpipe.get_provider_info import get_provider_info


def test_provider_info_validates_against_airflows_schema() -> None:
    import airflow

    schema_path = Path(airflow.__file__).parent / "provider_info.schema.json"
    jsonschema.validate(get_provider_info(), json.loads(schema_path.read_text()))


def test_provider_info_names_the_installed_version() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-trainpipe"
    assert info["versions"][0] == airflow_trainpipe.__version__


def test_every_listed_class_imports() -> None:
    info = get_provider_info()
    dotted = [
        cls
        for kind in ("operators", "sensors", "hooks", "triggers")
        for entry in info.get(kind, [])
        for cls in entry.get("python-modules", [])
    ]
    dotted += [entry["hook-class-name"] for entry in info.get("connection-types", [])]
    dotted += info.get("extra-links", [])
    for path in dotted:
        module, _, attr = (
            path.rpartition(".")
            if path.count(".") > 2 and path.rsplit(".", 1)[1][:1].isupper()
            else (path, "", "")
        )
        imported = importlib.import_module(module)
        assert not attr or hasattr(imported, attr), path


def test_entry_point_is_registered() -> None:
    found = [
        ep
        for ep in entry_points(group="apache_airflow_provider")
        if ep.value.startswith("airflow_trainpipe.")
    ]
    assert len(found) == 1 and found[0].load() is get_provider_info


def test_airflow_providers_list_shows_the_provider(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path)}
    airflow_cli = Path(sys.executable).parent / "airflow"
    out = subprocess.run(
        [str(airflow_cli), "providers", "list", "--output", "json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    providers = {p["package_name"]: p for p in json.loads(out[out.index("[") :])}
    assert providers["airflow-trainpipe"]["version"] == airflow_trainpipe.__version__
