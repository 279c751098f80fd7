"""Stand-in DAGs: always a valid, unique DAG id, and a bounded page whatever the file holds."""

from __future__ import annotations

import re

import pytest

from airflow_trainpipe.config.types import DAG_ID_MAX_LENGTH, DAG_ID_PATTERN
from airflow_trainpipe.core.exceptions import ConfigError, ConfigProblem
from airflow_trainpipe.factory.broken import MAX_LISTED_PROBLEMS, broken_config_dag, stand_in_dag_id


def _valid(dag_id: str) -> bool:
    return len(dag_id) <= DAG_ID_MAX_LENGTH and re.match(DAG_ID_PATTERN, dag_id) is not None


def test_the_declared_pipeline_name_when_valid_and_free() -> None:
    assert stand_in_dag_id("configs/x.yaml", "fraud_typo", {"fraud_detector"}) == "fraud_typo"
    assert stand_in_dag_id("configs/x.yaml", "fraud_detector", {"fraud_detector"}) == "broken_config__x"


@pytest.mark.parametrize(
    "declared", ["bad id!", "../../etc/passwd", "x" * (DAG_ID_MAX_LENGTH + 1), "", "é", "a\nb"]
)
def test_an_invalid_declared_name_falls_back_to_the_file(declared: str) -> None:
    assert stand_in_dag_id("configs/x.yaml", declared, set()) == "broken_config__x"


@pytest.mark.parametrize(
    "name",
    [
        "configs/" + "a" * 251 + ".yaml",
        "configs/caf\\xe9 \\x1b[31m.yaml",
        "configs/日本語.yml",
        "configs/.yaml.yaml",
        "configs",
        "configs/-.yaml",
    ],
)
def test_the_fallback_id_is_valid_for_any_file_name(name: str) -> None:
    first = stand_in_dag_id(name, None, set())
    second = stand_in_dag_id(name, None, {first})
    assert _valid(first) and _valid(second) and first != second


def test_file_names_that_clean_to_one_id_get_distinct_ids() -> None:
    taken: set[str] = set()
    for name in ("configs/a b.yaml", "configs/a_b.yaml", "configs/a?b.yaml"):
        dag_id = stand_in_dag_id(name, None, taken)
        assert dag_id not in taken and _valid(dag_id)
        taken.add(dag_id)
    assert len(taken) == 3


def test_thousands_of_problems_list_the_first_ones() -> None:
    problems = [ConfigProblem("configs/x.yaml", i, 1, f"k{i}", "unknown key") for i in range(1, 5001)]
    dag = broken_config_dag("configs/x.yaml", ConfigError(problems), "broken_config__x")
    assert dag.doc_md.count("\n- `configs/x.yaml:") == MAX_LISTED_PROBLEMS
    assert f"and {5000 - MAX_LISTED_PROBLEMS} more problem(s)" in dag.doc_md
    assert len(dag.doc_md) < 10_000 and len(dag.description) <= 1000
    [task] = dag.tasks
    assert len(task.problems) == MAX_LISTED_PROBLEMS + 1
