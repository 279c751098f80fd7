"""Field descriptions from the models' attribute docstrings, read only when something needs them.

Pydantic can collect them at class creation (`use_attribute_docstrings`), but it then reads and
parses every model's source whenever the package is imported: ~100 ms of a ~135 ms import, paid
by the DAG processor on every parse. Only error messages and the generated reference use them.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
from functools import cache

from pydantic import BaseModel


@cache
def field_descriptions(model: type[BaseModel]) -> dict[str, str]:
    """{field name: the string literal written right after its annotation}, inherited ones included."""
    descriptions: dict[str, str] = {}
    for klass in reversed(model.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, following in itertools.pairwise(body):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            ):
                descriptions[node.target.id] = inspect.cleandoc(following.value.value)
    return descriptions


def field_description(model: type[BaseModel], name: str) -> str | None:
    return field_descriptions(model).get(name)
