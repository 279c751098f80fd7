"""Feast's side of the feature store, run in the Feast interpreter (TRAINPIPE_FEAST_PYTHON), never
imported by an Airflow worker (Feast 0.67 needs pandas<3, the workers run pandas 3):

    <feast python> -m airflow_trainpipe.data.feature_store.child COMMAND SPEC_JSON RESULT_JSON

COMMAND is `retrieve` (point-in-time training rows), `materialize` (offline to online store) or
`online` (online feature values). The result file holds `{"ok": true, ...}`, or `{"ok": false,
"kind", "message", "retryable"}` for a failure this module recognised; the exit code is 0 for both.
Anything else (a bug, a missing module) exits non-zero with its traceback on stderr.

Only the stdlib, feast, pyarrow, pandas and numpy are imported here (`feature_store.client` runs
this with our `src` on PYTHONPATH, but none of the package's other modules is importable in the
Feast venv's terms: they would pull pydantic models and Airflow).

Retrieval sends Feast only a row number, the join keys and `event_timestamp` (UTC, microseconds),
and appends the features to the entity rows as read: every other column keeps its values and
types, and the rows keep their order. The offline store must return a row for every entity row:
Feast's file (dask) store drops rows with no feature value inside the TTL, so it is refused, and
a store that returns fewer rows than it was given fails the retrieval.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

if TYPE_CHECKING:
    from feast import FeatureStore, FeatureView

ROW = "__trainpipe_row"
EVENT_TIMESTAMP = "event_timestamp"
TIMESTAMP = pa.timestamp("us", tz="UTC")
# Feast's scalar dtypes as the Arrow types of the columns we write; other dtypes stay as Feast gives them.
ARROW_TYPES = {
    "Int64": pa.int64(),
    "Int32": pa.int32(),
    "Float64": pa.float64(),
    "Float32": pa.float32(),
    "String": pa.string(),
    "Bool": pa.bool_(),
    "Bytes": pa.binary(),
    "UnixTimestamp": TIMESTAMP,
}
# Offline stores that drop entity rows without a feature value inside the TTL (measured on 0.67.0).
ROW_DROPPING_STORES = ("file", "dask")


class Failure(Exception):
    """A failure this module recognised: becomes the result's kind, message and retryable."""

    def __init__(self, kind: str, message: str, retryable: bool = False):
        super().__init__(message)
        self.kind, self.message, self.retryable = kind, message, retryable


def skip_typeguard_instrumentation() -> None:
    """Let Feast's modules import undecorated by typeguard. Feast decorates its definition classes
    (FeatureView, Entity, Field, the data sources, ...) with typeguard's `@typechecked`, and
    typeguard 4 instruments by rewriting each decorated class's source and compiling it again as
    the module is imported: about 5 s of the ~7 s an `import feast` takes on 2 cores, which every
    child (each feature-store task's call) paid before its work began. This process reads a
    registry `feast apply` wrote and never builds a definition from a user's code, so the checks
    guard nothing here; `feast apply`, which runs the repo's own definitions, keeps them. It is
    what typeguard does under `python -O`, without -O dropping every assert of Feast and ours."""
    try:
        import typeguard
    except ImportError:  # a Feast without typeguard: nothing to skip
        return

    def undecorated(target: Any = None, **_options: Any) -> Any:
        return target if target is not None else undecorated  # @typechecked and @typechecked(...)

    typeguard.typechecked = undecorated


def open_store(repo: str) -> FeatureStore:
    from feast import FeatureStore

    try:
        return FeatureStore(repo_path=repo)
    except FileNotFoundError as exc:
        raise Failure("feast_error", f"no Feast repo at {repo}: {exc}") from exc


def require_row_keeping_store(store: FeatureStore) -> None:
    kind = str(getattr(store.config.offline_store, "type", ""))
    if kind in ROW_DROPPING_STORES:
        raise Failure(
            "offline_store_drops_rows",
            f"Feast repo {store.repo_path}: offline_store type {kind!r} silently drops every entity row "
            "with no feature value inside the view's TTL (a training set that loses labels); "
            "use `offline_store: {type: duckdb}` (feast[duckdb]), which keeps them with null features",
        )


def _views_listing(store: FeatureStore) -> str:
    views = store.list_feature_views()
    if not views:
        return "the registry has no feature views (was `feast apply` run?)"
    return "feature views: " + "; ".join(
        f"{fv.name} ({', '.join(f.name for f in fv.features)})" for fv in sorted(views, key=lambda v: v.name)
    )


def resolve(
    store: FeatureStore, features: list[str] | None, service_name: str | None
) -> tuple[list[str], list[FeatureView], Any]:
    """The `view:feature` references in output order, the views they use (registry order of first
    use) and what to hand Feast (the references, or the FeatureService)."""
    from feast.errors import FeatureServiceNotFoundException

    if service_name:
        try:
            service = store.get_feature_service(service_name)
        except FeatureServiceNotFoundException as exc:
            known = ", ".join(sorted(s.name for s in store.list_feature_services())) or "none"
            raise Failure(
                "unknown_feature",
                f"unknown feature service {service_name!r} in Feast project {store.project}; "
                f"feature services: {known}",
            ) from exc
        refs = [f"{p.name_to_use()}:{f.name}" for p in service.feature_view_projections for f in p.features]
        names = [p.name for p in service.feature_view_projections]
        target: Any = service
    else:
        refs, target = list(features or []), list(features or [])
        names = []
    views = {fv.name: fv for fv in store.list_feature_views()}
    for ref in refs:
        view, sep, feature = ref.partition(":")
        fv = views.get(view)
        if not sep or fv is None or feature not in {f.name for f in fv.features}:
            what = "view" if sep and fv is None else "feature"
            raise Failure(
                "unknown_feature",
                f"unknown feature reference {ref!r} (unknown {what}; a reference is VIEW:FEATURE) "
                f"in Feast project {store.project}; {_views_listing(store)}",
            )
        if view not in names:
            names.append(view)
    if not refs:
        raise Failure("unknown_feature", f"no feature references given; {_views_listing(store)}")
    return refs, [views[name] for name in names], target


def join_keys(fv: FeatureView) -> list[str]:
    return [column.name for column in fv.entity_columns]


def definition_sha256(fv: FeatureView) -> str:
    """Hash of the view's definition: its spec without the sources' registry timestamps, which
    change on every apply of the same definitions."""
    spec = fv.to_proto().spec
    for source in (spec.batch_source, spec.stream_source):
        source.ClearField("meta")
    return hashlib.sha256(spec.SerializeToString(deterministic=True)).hexdigest()


def view_info(fv: FeatureView) -> dict[str, Any]:
    return {
        "name": fv.name,
        "join_keys": join_keys(fv),
        "ttl_seconds": int(fv.ttl.total_seconds()) if fv.ttl else 0,
        "schema": {f.name: str(f.dtype) for f in fv.features},
        "sha256": definition_sha256(fv),
    }


def require_sources(views: list[FeatureView]) -> None:
    """A local Parquet source that is not there: the offline store cannot be read."""
    for fv in views:
        path = str(getattr(fv.batch_source, "path", "") or "")
        if path and "://" not in path and not Path(path).exists():
            raise Failure(
                "offline_store_unreachable",
                f"feature view {fv.name}: its source {path} does not exist",
                retryable=True,
            )


def read_entities(files: list[str], timestamp_column: str) -> pa.Table:
    tables = [pq.read_table(f) for f in files]
    if not tables:
        raise Failure("missing_entity_column", "no entity files given")
    try:
        table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    except pa.ArrowInvalid as exc:
        raise Failure("missing_entity_column", f"the entity files' columns differ: {exc}") from exc
    if timestamp_column not in table.column_names:
        raise Failure(
            "bad_timestamp",
            f"timestamp column {timestamp_column!r} is not among the entity columns: {', '.join(table.column_names)}",
        )
    if not pa.types.is_timestamp(table[timestamp_column].type):
        raise Failure(
            "bad_timestamp",
            f"timestamp column {timestamp_column!r} is {table[timestamp_column].type}, not a timestamp",
        )
    return table


def require_keys(table: pa.Table, views: list[FeatureView]) -> list[str]:
    """The join keys of `views`, in order, each checked to be an entity column."""
    keys: list[str] = []
    for fv in views:
        for key in join_keys(fv):
            if key not in table.column_names:
                raise Failure(
                    "missing_entity_column",
                    f"entity column {key!r}, the join key of feature view {fv.name}, is missing; "
                    f"entity columns: {', '.join(table.column_names)}",
                )
            if key not in keys:
                keys.append(key)
    return keys


def output_names(refs: list[str], full_feature_names: bool) -> list[str]:
    return [ref.replace(":", "__") if full_feature_names else ref.split(":", 1)[1] for ref in refs]


def feature_types(refs: list[str], views: list[FeatureView]) -> list[str]:
    schema = {f"{fv.name}:{f.name}": str(f.dtype) for fv in views for f in fv.features}
    return [schema[ref] for ref in refs]


def typed(column: pa.ChunkedArray | pa.Array, dtype: str) -> pa.ChunkedArray | pa.Array:
    target = ARROW_TYPES.get(dtype)
    if target is None or column.type == target:
        return column
    if pa.types.is_timestamp(target) and pa.types.is_timestamp(column.type) and column.type.tz is None:
        column = column.cast(pa.timestamp(column.type.unit, tz="UTC"))
    return column.cast(target)


def append_features(table: pa.Table, features: pa.Table, names: list[str], dtypes: list[str]) -> pa.Table:
    if clash := [name for name in names if name in table.column_names]:
        raise Failure(
            "feature_name_collision",
            f"feature column {clash[0]!r} would replace the entity column of that name; "
            "rename it, or ask for full feature names (VIEW__FEATURE)",
        )
    for name, dtype in zip(names, dtypes, strict=True):
        table = table.append_column(name, typed(features[name], dtype))
    return table


def classify(exc: Exception, views: list[FeatureView]) -> Failure:
    """A Feast or offline-store exception as a result: unreachable sources may come back."""
    from feast.errors import FeastObjectNotFoundException

    text = f"{type(exc).__name__}: {exc}".strip()
    if isinstance(exc, FeastObjectNotFoundException):
        return Failure("unknown_feature", text)
    module = type(exc).__module__.split(".")[0]
    io_error = isinstance(exc, OSError) or (
        module in ("duckdb", "_duckdb") and type(exc).__name__ in ("IOException", "HTTPException")
    )
    if io_error:
        named = [fv.name for fv in views if str(getattr(fv.batch_source, "path", "") or "?") in str(exc)]
        where = (
            f"feature view {', '.join(named)}"
            if named
            else f"feature views {', '.join(v.name for v in views)}"
        )
        return Failure(
            "offline_store_unreachable", f"{where}: the offline store cannot be read: {text}", True
        )
    return Failure("feast_error", text)


def entity_frame(table: pa.Table, keys: list[str], timestamp_column: str) -> Any:
    """What Feast gets: the row number, the join keys and `event_timestamp` (UTC, microseconds;
    a column without a time zone is UTC)."""
    stamps = table[timestamp_column]
    stamps = stamps.cast(pa.timestamp(stamps.type.unit, tz="UTC")) if stamps.type.tz is None else stamps
    columns = {ROW: pa.array(range(table.num_rows), pa.int64())}
    columns.update({key: table[key] for key in keys})
    columns[EVENT_TIMESTAMP] = stamps.cast(TIMESTAMP)
    return pa.table(columns).to_pandas()


def retrieve(spec: dict[str, Any]) -> dict[str, Any]:
    store = open_store(spec["repo"])
    require_row_keeping_store(store)
    refs, views, target = resolve(store, spec.get("features"), spec.get("feature_service"))
    table = read_entities(spec["entity_files"], spec["timestamp_column"])
    keys = require_keys(table, views)
    require_sources(views)
    frame = entity_frame(table, keys, spec["timestamp_column"])
    full = bool(spec.get("full_feature_names"))
    try:
        job = store.get_historical_features(entity_df=frame, features=target, full_feature_names=full)
        result = job.to_arrow()
    except Exception as exc:
        raise classify(exc, views) from exc
    if result.num_rows != table.num_rows:
        raise Failure(
            "offline_store_drops_rows",
            f"the offline store returned {result.num_rows} rows for {table.num_rows} entity rows",
        )
    result = result.take(pc.sort_indices(result[ROW]))
    names = output_names(refs, full)
    out = append_features(table, result, names, feature_types(refs, views))
    pq.write_table(out, spec["output"])
    return {
        "project": store.project,
        "features": refs,
        "views": [view_info(fv) for fv in views],
        "rows": out.num_rows,
    }


def _parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def materialize(spec: dict[str, Any]) -> dict[str, Any]:
    """Each view loaded into the online store up to `end`: its first load from `cover_from` minus
    its TTL (Feast's own first `materialize_incremental` starts at now - TTL, which misses older
    rows serving still needs), later ones incrementally from where the last one ended."""
    from feast.errors import FeatureViewNotFoundException

    store = open_store(spec["repo"])
    end, cover_from = _parse_time(spec["end"]), _parse_time(spec["cover_from"])
    began, done = time.monotonic(), {}
    for name in spec["feature_views"]:
        try:
            fv = store.get_feature_view(name)
        except FeatureViewNotFoundException as exc:
            raise Failure(
                "unknown_feature", f"unknown feature view {name!r}; {_views_listing(store)}"
            ) from exc
        require_sources([fv])
        first = not fv.materialization_intervals
        if first:
            start = cover_from - fv.ttl if fv.ttl else datetime(1970, 1, 1, tzinfo=UTC)
        else:
            start = max(interval_end for _, interval_end in fv.materialization_intervals)
        try:
            if first:
                store.materialize(start_date=start, end_date=end, feature_views=[name])
            else:
                store.materialize_incremental(end_date=end, feature_views=[name])
        except Exception as exc:
            raise classify(exc, [fv]) from exc
        done[name] = {"start": start.isoformat(), "end": end.isoformat(), "first": first}
    return {"views": done, "seconds": round(time.monotonic() - began, 3)}


def online(spec: dict[str, Any]) -> dict[str, Any]:
    store = open_store(spec["repo"])
    refs, views, target = resolve(store, spec.get("features"), spec.get("feature_service"))
    table = pq.read_table(spec["entity_file"])
    keys = require_keys(table, views)
    rows = table.select(keys).to_pylist()
    full = bool(spec.get("full_feature_names"))
    as_of = spec.get("as_of")
    try:
        response = store.get_online_features(features=target, entity_rows=rows, full_feature_names=full)
        values = response.to_arrow(include_event_timestamps=as_of is not None)
    except Exception as exc:
        raise classify(exc, views) from exc
    if as_of is not None:
        values = expire(values, refs, views, output_names(refs, full), _parse_time(as_of))
    out = append_features(table, values, output_names(refs, full), feature_types(refs, views))
    pq.write_table(out, spec["output"])
    return {"project": store.project, "features": refs, "rows": out.num_rows}


def expire(
    values: pa.Table, refs: list[str], views: list[FeatureView], names: list[str], as_of: datetime
) -> pa.Table:
    """Null each value older than its view's TTL at `as_of`, as the historical join does: the
    online store keeps an entity's last value however old it is."""
    ttl = {fv.name: (fv.ttl.total_seconds() if fv.ttl else 0.0) for fv in views}
    for ref, name in zip(refs, names, strict=True):
        seconds = ttl[ref.split(":", 1)[0]]
        if seconds <= 0:
            continue
        stamps = values.column(name + "__ts").cast(pa.float64())
        stale = pc.less(stamps, as_of.timestamp() - seconds)
        column = values.column(name)
        kept = pc.if_else(stale, pa.scalar(None, column.type), column)
        values = values.set_column(values.column_names.index(name), name, kept)
    return values


COMMANDS = {"retrieve": retrieve, "materialize": materialize, "online": online}


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] not in COMMANDS:
        print(f"usage: child {{{','.join(COMMANDS)}}} SPEC_JSON RESULT_JSON (got {argv})", file=sys.stderr)
        return 2
    command, spec_file, result_file = argv
    spec = json.loads(Path(spec_file).read_text())
    skip_typeguard_instrumentation()  # before the command's first import of feast
    try:
        result: dict[str, Any] = {"ok": True, **COMMANDS[command](spec)}
    except Failure as failure:
        result = {
            "ok": False,
            "kind": failure.kind,
            "message": failure.message,
            "retryable": failure.retryable,
        }
    Path(result_file).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
