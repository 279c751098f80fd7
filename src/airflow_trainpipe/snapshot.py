"""Resolve the files of one run's partition.

The data issue turns this into an immutable manifest (files, sizes, rows, schema, digest);
until then a snapshot is the sorted list of data files under `<data.uri>/<partition>/`.
"""

from __future__ import annotations

from airflow_trainpipe.config.data import DataSection
from airflow_trainpipe.exceptions import TrainpipeError
from airflow_trainpipe.storage import filesystem, join, resolve


class SnapshotError(TrainpipeError):
    """The partition is missing or holds no data files."""


def partition_uri(data: DataSection, partition: str) -> str:
    return join(resolve(data.uri), partition)


def partition_files(data: DataSection, partition: str) -> list[str]:
    uri = partition_uri(data, partition)
    fs, path = filesystem(uri)
    suffix = ".parquet" if data.format == "parquet" else ".csv"
    try:
        names = sorted(p for p in fs.find(path) if p.endswith(suffix))
    except FileNotFoundError:
        names = []
    if not names:
        raise SnapshotError(f"no *{suffix} files under {uri}")
    protocol = uri.split("://", 1)[0]
    return [f"{protocol}://{name}" if protocol != "file" else f"file://{name}" for name in names]


def render_partition(template: str, ds: str) -> str:
    """Render `data.partition` outside Airflow (the CLI), with the Airflow names it commonly uses."""
    from datetime import datetime, timedelta, timezone

    import jinja2

    start = datetime.fromisoformat(ds).replace(tzinfo=timezone.utc)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update({"ds": lambda d: d.strftime("%Y-%m-%d"), "ds_nodash": lambda d: d.strftime("%Y%m%d")})
    context = {
        "ds": ds, "ds_nodash": ds.replace("-", ""), "logical_date": start,
        "data_interval_start": start, "data_interval_end": start + timedelta(days=1),
    }
    try:
        return env.from_string(template).render(**context)
    except jinja2.UndefinedError as exc:
        raise SnapshotError(f"cannot render partition {template!r} outside Airflow: {exc}") from exc
