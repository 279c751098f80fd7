"""The suite's own scheduling: the shared e2e stack's modules run last in tests/integration, so
the stack is never idle beside another scenario (tests/integration/conftest.py)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import SHARED_FIXTURE_FILES
from tests.integration.conftest import pytest_collection_modifyitems


def _items(*nodeids: str) -> list[SimpleNamespace]:
    return [SimpleNamespace(nodeid=nodeid) for nodeid in nodeids]


def test_the_stack_modules_run_after_the_package_s_others_and_nothing_else_moves():
    soak, standalone = SHARED_FIXTURE_FILES["stack"][:2]
    items = _items(
        "tests/hooks/test_a.py::test_1",
        "tests/integration/test_canary.py::test_1",
        f"{soak}::test_1",
        f"{standalone}::test_1",
        f"{standalone}::test_2",
        "tests/integration/test_sql_source.py::test_1",
        "tests/integration/test_task_types.py::test_1",
        "tests/launchers/test_b.py::test_1",
    )
    pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        "tests/hooks/test_a.py::test_1",
        "tests/integration/test_canary.py::test_1",
        "tests/integration/test_sql_source.py::test_1",
        "tests/integration/test_task_types.py::test_1",
        f"{soak}::test_1",
        f"{standalone}::test_1",
        f"{standalone}::test_2",
        "tests/launchers/test_b.py::test_1",
    ]


def test_a_run_without_integration_tests_is_left_as_it_was():
    items = _items("tests/hooks/test_a.py::test_1", "tests/hooks/test_a.py::test_2")
    pytest_collection_modifyitems(items)
    assert [item.nodeid for item in items] == [
        "tests/hooks/test_a.py::test_1",
        "tests/hooks/test_a.py::test_2",
    ]
