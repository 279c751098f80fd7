"""Validated snapshots of a pipeline: the references for volume and drift checks.

One JSON record per partition at `<data.uri>/_trainpipe/validated/<pipeline>/<partition>.json`
with the manifest's digest, rows, columns and the feature profiles. "Previous" means the latest
partition before this one, so a backfill compares with its own past, not with today.
"""

from __future__ import annotations

import json
from typing import Any

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.core.storage import filesystem, join, resolve
from airflow_trainpipe.data.snapshots.partitions import STATE_DIR


def _folder(data: DataSection, pipeline: str) -> str:
    return join(resolve(data.uri), STATE_DIR, "validated", pipeline)


def _name(partition: str) -> str:
    return partition.strip("/").replace("/", "__") + ".json"


def records(data: DataSection, pipeline: str, conn_id: str | None = None) -> list[dict[str, Any]]:
    fs, path = filesystem(_folder(data, pipeline), conn_id)
    try:
        names = sorted(p for p in fs.ls(path, detail=False) if p.endswith(".json"))
    except FileNotFoundError:
        return []
    return [json.loads(fs.cat_file(name)) for name in names]


def previous(
    data: DataSection, pipeline: str, partition: str, conn_id: str | None = None
) -> dict[str, Any] | None:
    earlier = [r for r in records(data, pipeline, conn_id) if _name(r["partition"]) < _name(partition)]
    return earlier[-1] if earlier else None


def at(data: DataSection, pipeline: str, partition: str, conn_id: str | None = None) -> dict[str, Any] | None:
    """The record of exactly this partition, if it was ever validated and kept."""
    fs, path = filesystem(join(_folder(data, pipeline), _name(partition)), conn_id)
    try:
        return dict(json.loads(fs.cat_file(path)))
    except FileNotFoundError:
        return None


def by_digest(
    data: DataSection, pipeline: str, digest: str, conn_id: str | None = None
) -> dict[str, Any] | None:
    matches = [r for r in records(data, pipeline, conn_id) if r["digest"] == digest]
    return matches[-1] if matches else None


def record(
    data: DataSection, pipeline: str, partition: str, payload: dict[str, Any], conn_id: str | None = None
) -> str:
    uri = join(_folder(data, pipeline), _name(partition))
    fs, path = filesystem(uri, conn_id)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(path, json.dumps({"partition": partition, **payload}, sort_keys=True).encode())
    return uri
