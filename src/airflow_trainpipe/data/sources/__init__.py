"""Where a run's rows come from (`data.source`): one `SourceKind` per kind, one module each.

`files` (partitions under `data.uri`), `sql` (a query on an Airflow connection), `delta` and
`iceberg` (a table's current version). `source_kind(name)` imports the kind's module only when a
run uses it (each imports its drivers when used); `lineage_tags(manifest)` is what a snapshot's
lineage adds to the MLflow run, whatever its kind. Light: the stdlib only at import.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_trainpipe.contracts.manifest import Manifest
    from airflow_trainpipe.data.sources.base import SourceKind


def source_kind(name: str) -> SourceKind:
    """The kind `data.source.kind` names: `KIND` of the module `data.sources.<name>`."""
    from airflow_trainpipe.data.sources.errors import SourceError

    try:
        module = importlib.import_module(f"{__name__}.{name}") if name.isidentifier() else None
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise  # the kind exists, a driver it imports does not
        module = None
    kind = getattr(module, "KIND", None)
    if kind is None:
        raise SourceError(f"unknown source kind {name!r}")
    return kind  # type: ignore[no-any-return]


def lineage_tags(manifest: Manifest) -> dict[str, str]:
    """The MLflow tags of where the snapshot came from, beyond its digest: the window's
    partitions, the source's own (an exported kind's), the features joined from a store."""
    source = manifest.source
    return {
        **manifest.window_tags(),
        **(source_kind(source.kind).lineage_tags(source) if source is not None else {}),
        **(manifest.features.tags() if manifest.features else {}),
    }
