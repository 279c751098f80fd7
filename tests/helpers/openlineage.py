"""The OpenLineage events a run wrote through the provider's file transport, and their check
against the spec's JSON schemas (tests/openlineage/spec), offline.

Every facet is checked against the schema its `_schemaURL` names: the spec's own facets against
the vendored spec, ours against `airflow_trainpipe/openlineage/facets.json`, the provider's
(`airflow`, `airflowDagRun`, ...) against the JSON files the provider ships.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

SPEC = Path(__file__).parents[1] / "openlineage" / "spec"


def transport_env(events: Path) -> dict[str, str]:
    """Environment of an Airflow whose OpenLineage provider appends every event to `events`
    (JSON lines), synchronously in the task's thread (no fork of the task process)."""
    return {
        "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
            {"type": "file", "log_file_path": str(events), "append": True}
        ),
        "AIRFLOW__OPENLINEAGE__NAMESPACE": "trainpipe-tests",
        "AIRFLOW__OPENLINEAGE__EXECUTE_IN_THREAD": "True",
    }


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def task_events(
    events: list[dict[str, Any]], dag_id: str, task_id: str, event_type: str
) -> list[dict[str, Any]]:
    """The task's events of one type (START, COMPLETE, FAIL), in the order they were written."""
    return [e for e in events if e["job"]["name"] == f"{dag_id}.{task_id}" and e["eventType"] == event_type]


def facets_of(dataset: dict[str, Any]) -> dict[str, Any]:
    return {**dataset.get("facets", {}), **dataset.get("inputFacets", {}), **dataset.get("outputFacets", {})}


@cache
def _registry() -> Any:
    import airflow.providers.openlineage as provider
    from referencing import Registry, Resource

    import airflow_trainpipe.openlineage as ours

    documents = [
        json.loads(p.read_text())
        for p in [SPEC / "OpenLineage.json", *sorted((SPEC / "facets").glob("*.json"))]
    ]
    documents.append(json.loads((Path(ours.__file__).parent / "facets.json").read_text()))
    resources = [(d["$id"], Resource.from_contents(d)) for d in documents]
    # The provider's facet schemas carry no $id: registered under the URL its facets name.
    provider_facets = {p.name: p for p in (Path(provider.__file__).parent / "facets").glob("*.json")}
    return Registry().with_resources(resources), provider_facets


def schema_errors(event: dict[str, Any]) -> list[str]:
    """Every way `event` breaks the spec: the event itself, then each of its facets."""
    from jsonschema import Draft202012Validator, FormatChecker
    from referencing import Resource

    registry, provider_facets = _registry()
    core = registry.contents("https://openlineage.io/spec/2-0-2/OpenLineage.json")
    errors = [
        e.message
        for e in Draft202012Validator(core, registry=registry, format_checker=FormatChecker()).iter_errors(
            event
        )
    ]
    facets = [*event["run"].get("facets", {}).items(), *event["job"].get("facets", {}).items()]
    for dataset in [*event.get("inputs", []), *event.get("outputs", [])]:
        facets += facets_of(dataset).items()
    for key, facet in facets:
        url = facet["_schemaURL"]
        base = url.split("#")[0]
        file_name = base.rsplit("/", 1)[-1]
        if base not in {str(uri) for uri in registry} and file_name in provider_facets:
            registry = registry.with_resource(
                base, Resource.from_contents(json.loads(provider_facets[file_name].read_text()))
            )
        try:
            registry.get_or_retrieve(base)
        except Exception:
            errors.append(f"{key}: no schema for {url}")
            continue
        validator = Draft202012Validator({"$ref": url}, registry=registry, format_checker=FormatChecker())
        errors += [f"{key}: {e.message}" for e in validator.iter_errors(facet)]
    return errors
