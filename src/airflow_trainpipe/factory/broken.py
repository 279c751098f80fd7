"""A broken config's stand-in DAG: the error in the Airflow UI, every other DAG untouched.

Airflow 3.3 records import errors per Python file, so raising from the loader would hide every
pipeline of the folder, and warnings captured while parsing are only logged. A stand-in DAG,
under the pipeline's own id when the file still names one, puts the error where users look:
its display name and tags mark it in the DAG list, its description and Docs give the file,
line, field and what is expected, and it has no schedule; triggering it fails with the same text.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone

import yaml
from airflow.sdk import DAG

from airflow_trainpipe.config.types import DAG_ID_MAX_LENGTH, DAG_ID_PATTERN
from airflow_trainpipe.exceptions import ConfigError
from airflow_trainpipe.operators.config_error import ConfigErrorOperator

BROKEN_TAG = "trainpipe:broken-config"
_DAG_ID = re.compile(DAG_ID_PATTERN)


def broken_config_dag(name: str, error: ConfigError, dag_id: str) -> DAG:
    problems = "\n".join(f"- `{problem}`" for problem in error.problems)
    first = error.problems[0]
    with DAG(
        dag_id=dag_id,
        dag_display_name=f"{dag_id} [broken config: {name}]",
        description=f"BROKEN CONFIG {name}: {first.path or '<document>'}: {first.message}"[:1000],
        doc_md=(f"# Broken pipeline config `{name}`\n\nThis pipeline does not run until its config is fixed "
                f"({len(error.problems)} problem(s)); every other pipeline is unaffected.\n\n{problems}\n"),
        schedule=None,
        start_date=datetime(2020, 1, 1, tzinfo=timezone.utc),
        tags=["trainpipe", BROKEN_TAG],
    ) as dag:
        ConfigErrorOperator(task_id="config_error", config_file=name, problems=[str(p) for p in error.problems])
    return dag


def pipeline_name_of(text_path: str) -> str | None:
    """The `pipeline:` a broken file still declares, so its stand-in takes over that DAG's page."""
    try:
        with open(text_path, encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    name = data.get("pipeline") if isinstance(data, dict) else None
    return name if isinstance(name, str) and len(name) <= DAG_ID_MAX_LENGTH and _DAG_ID.match(name) else None


def fallback_dag_id(name: str) -> str:
    stem = re.sub(r"\.ya?ml$", "", name.rsplit("/", 1)[-1])
    return "broken_config__" + re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:200]
