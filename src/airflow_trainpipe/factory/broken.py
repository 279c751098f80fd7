"""A broken config's stand-in DAG: the error in the Airflow UI, every other DAG untouched.

Airflow 3.3 records import errors per Python file, so raising from the loader would hide every
pipeline of the folder, and warnings captured while parsing are only logged. A stand-in DAG,
under the pipeline's own id when the file still names one, puts the error where users look:
its display name and tags mark it in the DAG list, its description and Docs give the file,
line, field and what is expected, and it has no schedule; triggering it fails with the same text.
Its id is always a valid DAG id no other DAG of the folder holds, whatever the file is called.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Container
from datetime import UTC, datetime

from airflow.sdk import DAG

from airflow_trainpipe.config.types import DAG_ID_MAX_LENGTH, DAG_ID_PATTERN
from airflow_trainpipe.core.exceptions import ConfigError
from airflow_trainpipe.operators.config_error import ConfigErrorOperator

BROKEN_TAG = "trainpipe:broken-config"
_DAG_ID = re.compile(DAG_ID_PATTERN)
# A file of 5,000 unknown keys is 5,000 problems: the Docs page and the task list the first
# ones; `trainpipe check` prints them all.
MAX_LISTED_PROBLEMS = 50


def broken_config_dag(name: str, error: ConfigError, dag_id: str) -> DAG:
    shown = [str(problem) for problem in error.problems[:MAX_LISTED_PROBLEMS]]
    if hidden := len(error.problems) - len(shown):
        shown.append(f"... and {hidden} more problem(s); `trainpipe check` lists them all")
    problems = "\n".join(f"- `{problem}`" for problem in shown)
    first = error.problems[0]
    with DAG(
        dag_id=dag_id,
        dag_display_name=f"{dag_id} [broken config: {name}]",
        description=f"BROKEN CONFIG {name}: {first.path or '<document>'}: {first.message}"[:1000],
        doc_md=(
            f"# Broken pipeline config `{name}`\n\nThis pipeline does not run until its config is fixed "
            f"({len(error.problems)} problem(s)); every other pipeline is unaffected.\n\n{problems}\n"
        ),
        schedule=None,
        start_date=datetime(2020, 1, 1, tzinfo=UTC),
        tags=["trainpipe", BROKEN_TAG],
    ) as dag:
        ConfigErrorOperator(task_id="config_error", config_file=name, problems=shown)
    return dag


def stand_in_dag_id(name: str, declared: str | None, taken: Container[str]) -> str:
    """The stand-in's id: the `pipeline:` the file declares (from the loader, which parsed it
    within the limits: never a second parse) when it is a valid DAG id nobody holds, so the
    pipeline's own page shows the problem; else `broken_config__<file>`, with a hash of the
    file name when that is taken too (`a b.yaml` and `a_b.yaml`, or two long names).
    """
    if (
        declared is not None
        and len(declared) <= DAG_ID_MAX_LENGTH
        and _DAG_ID.match(declared)
        and declared not in taken
    ):
        return declared
    dag_id = fallback_dag_id(name)
    if dag_id in taken:
        dag_id += "__" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return dag_id


def fallback_dag_id(name: str) -> str:
    """`broken_config__<file stem>`: at most 215 characters of `[A-Za-z0-9_.-]`, whatever the name."""
    stem = re.sub(r"\.ya?ml$", "", name.rsplit("/", 1)[-1])
    return "broken_config__" + re.sub(r"[^A-Za-z0-9_.-]", "_", stem)[:200]
