"""The demo's fraud_detector config reading another `data.source` kind: one shape for the sql,
delta and iceberg helpers (warehouse.py, lake.py, iceberg_lake.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def source_config(
    folder: Path, source: dict[str, Any], name: str, partitions: int | None = None, **data: Any
) -> Path:
    """fraud_detector reading `source` instead of files, waiting for rows (poke, 1 s), its
    records, snapshots and checkpoints under `folder`; written to `folder/<name>.yaml`."""
    from tests.conftest import EXAMPLE_CONFIGS

    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["data"].update(
        {
            "uri": (folder / "records").as_uri(),
            "source": source,
            "wait": {"min_rows": 100, "mode": "poke", "poke_interval": "1s", "timeout": "60s"},
            **data,
        }
    )
    config["data"].pop("format", None)
    if partitions is not None:
        config["data"]["window"] = {"partitions": partitions}
    config["snapshots"] = {"uri": (folder / "snapshots").as_uri()}
    config["training"]["checkpoint"]["uri"] = (folder / "checkpoints").as_uri()
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def assert_reproduces(model: str, env: dict[str, str]) -> None:
    """`trainpipe reproduce MODEL` (name@alias or name/version), as a user runs it: exit 0 and
    'identical' (the same weights and metrics from the run's frozen snapshot)."""
    import subprocess
    import sys

    again = subprocess.run(
        [sys.executable, "-m", "airflow_trainpipe.cli", "reproduce", model],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "identical" in again.stdout, (again.stdout + again.stderr)[-6000:]
