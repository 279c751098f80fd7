"""Load a pipeline config file: safe YAML with source positions, then the typed model.

Every problem is reported with the file, line, column and field path, and all problems of a
file are reported together so a user fixes them in one pass. Whatever the bytes of a file,
loading it returns a config or raises ConfigError naming it: size and shape limits
(`config.limits`) stop hostile YAML early, and an exception no check foresaw becomes a
ConfigError too, its traceback logged (KeyboardInterrupt and SystemExit pass through).
"""

from __future__ import annotations

import logging
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from airflow_trainpipe.config.docstrings import field_description
from airflow_trainpipe.config.files import offset_position, printable_name, read_config_text
from airflow_trainpipe.config.limits import LimitExceeded, compose_limited, size_problem
from airflow_trainpipe.config.pipeline import PipelineConfig
from airflow_trainpipe.config.secrets import SECRET_KEY
from airflow_trainpipe.config.suggest import did_you_mean
from airflow_trainpipe.core.exceptions import ConfigError, ConfigProblem

if typing.TYPE_CHECKING:
    from pydantic_core import ErrorDetails

log = logging.getLogger(__name__)

Loc = tuple[str | int, ...]
Position = tuple[int, int]

CONFIG_SUFFIXES = (".yaml", ".yml")

# `pkg.module:attr` (entry-point style) or `_target_` (hydra style) would let a config choose
# code to run; configs name registered things only.
_IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+:[A-Za-z_][\w.]*$")
_IMPORT_KEYS = frozenset({"_target_", "__class__", "class_path", "callable"})
# libyaml reports a bad character's position in bytes of UTF-8, PyYAML's reader in characters.
_BYTE_POSITIONS = hasattr(yaml, "CSafeLoader")
# `${SECRET}` or `$SECRET` expansion is deliberately unsupported: secrets live in connections.
_ENV_REFERENCE = re.compile(r"\$\{[^}]*\}|\$[A-Z_][A-Z0-9_]{2,}")


def load_config(path: str | Path) -> PipelineConfig:
    """Parse and validate one config file; raise ConfigError listing every problem in it."""
    source = printable_name(path)
    return parse_config(read_config_text(path, source), source=source)


def as_config(config: PipelineConfig | str | Path) -> PipelineConfig:
    """An operator's `config` argument: the parsed config as it is, or the path of its file loaded."""
    return config if isinstance(config, PipelineConfig) else load_config(config)


def duplicate_pipeline(source: str, pipeline: str, first: str) -> ConfigProblem:
    """Two files naming one pipeline would fight over one DAG id: the later one is at fault."""
    return ConfigProblem(
        source,
        None,
        None,
        "pipeline",
        f"{pipeline!r} is already defined by {first}; pipeline names are DAG ids and must be unique",
    )


def parse_config(text: str, source: str = "<string>") -> PipelineConfig:
    """Parse config text; `source` names it in error messages. Raises ConfigError only."""
    try:
        return _parse(text, source)
    except ConfigError:
        raise
    except Exception as exc:  # not BaseException: KeyboardInterrupt, SystemExit, Airflow's parse timeout
        log.error("loading pipeline config %s failed unexpectedly", source, exc_info=exc)
        raise ConfigError.unexpected(source, "loading it", exc) from exc


def _parse(text: str, source: str) -> PipelineConfig:
    document = _Document(source)
    data = document.load(text)
    pipeline = data.get("pipeline") if isinstance(data, dict) else None
    pipeline = pipeline if isinstance(pipeline, str) else None
    if document.problems:
        raise ConfigError(document.problems, pipeline=pipeline)
    if not isinstance(data, dict):
        kind = "an empty file" if data is None else f"a {type(data).__name__}"
        line, column = document.value_positions.get((), (1, 1))
        raise ConfigError(
            [ConfigProblem(source, line, column, "", f"expected a mapping of config sections, got {kind}")]
        )
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(document.problems_from(exc), pipeline=pipeline) from None


class _Document:
    """One YAML document turned into plain Python values, remembering where each value was."""

    def __init__(self, source: str):
        self.source = source
        # Where each key was written, and where its value starts: a missing or unknown key is
        # reported at the key, a bad value at the value.
        self.key_positions: dict[Loc, Position] = {}
        self.value_positions: dict[Loc, Position] = {}
        self.problems: list[ConfigProblem] = []
        self._scalars = yaml.SafeLoader("")  # only its scalar constructors are used

    def load(self, text: str) -> Any:
        try:
            encoded = text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate: only text built in Python has one
            self.problems.append(
                ConfigProblem(
                    self.source,
                    *offset_position(text, exc.start),
                    "",
                    f"invalid character U+{ord(text[exc.start]):04X} ({exc.reason})",
                )
            )
            return None
        if too_big := size_problem(len(encoded)):
            self.problems.append(ConfigProblem(self.source, None, None, "", too_big))
            return None
        try:
            root = compose_limited(text)
        except LimitExceeded as exc:
            self.problems.append(
                ConfigProblem(self.source, exc.mark.line + 1, exc.mark.column + 1, "", exc.message)
            )
            return None
        except yaml.MarkedYAMLError as exc:
            self.problems.append(_yaml_problem(self.source, exc))
            return None
        except yaml.reader.ReaderError as exc:  # a character YAML forbids (NUL, other controls)
            line, column = offset_position(encoded if _BYTE_POSITIONS else text, exc.position)
            self.problems.append(
                ConfigProblem(self.source, line, column, "", f"invalid YAML: {_reader_reason(exc)}")
            )
            return None
        except yaml.YAMLError as exc:
            self.problems.append(
                ConfigProblem(self.source, None, None, "", f"invalid YAML: {_short(str(exc))}")
            )
            return None
        return None if root is None else self._value(root, ())

    def _add(self, loc: Loc, node: yaml.Node, message: str) -> None:
        self.problems.append(
            ConfigProblem(
                self.source, node.start_mark.line + 1, node.start_mark.column + 1, _dotted(loc), message
            )
        )

    def _value(self, node: yaml.Node, loc: Loc) -> Any:
        self.value_positions[loc] = (node.start_mark.line + 1, node.start_mark.column + 1)
        if node.tag.startswith("tag:yaml.org,2002:python/") or node.tag.startswith("!"):
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            self._add(loc, node, f"YAML tag {tag} is not allowed; configs are plain safe YAML")
            return None
        if isinstance(node, yaml.MappingNode):
            return self._mapping(node, loc)
        if isinstance(node, yaml.SequenceNode):
            return [self._value(item, (*loc, i)) for i, item in enumerate(node.value)]
        value, problem = self._scalar(typing.cast(yaml.ScalarNode, node))  # the only other kind
        if problem is not None:
            self._add(loc, node, f"invalid value: {problem}")
        elif isinstance(value, str):
            self._check_string(value, loc, node)
        return value

    def _scalar(self, node: yaml.ScalarNode) -> tuple[Any, str | None]:
        try:
            return self._scalars.construct_object(node, deep=True), None
        except yaml.constructor.ConstructorError as exc:
            return None, exc.problem
        except Exception as exc:
            # PyYAML's scalar constructors fail in assorted ways: ValueError for `2026-13-01`
            # or an int of over 4,300 digits, KeyError for `!!bool maybe`, AttributeError for
            # `!!timestamp now`.
            detail = f": {_short(str(exc))}" if isinstance(exc, ValueError) else ""
            return None, f"not a valid {node.tag.rsplit(':', 1)[-1]}{detail}"

    def _mapping(self, node: yaml.MappingNode, loc: Loc) -> dict[str, Any]:
        try:
            self._scalars.flatten_mapping(node)  # resolves `<<: *anchor` merges
        except yaml.constructor.ConstructorError as exc:
            self._add(loc, node, f"invalid merge: {exc.problem}")
            return {}
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._scalar(key_node)[0] if isinstance(key_node, yaml.ScalarNode) else None
            if not isinstance(key, str):
                got = (
                    _short(repr(key_node.value))
                    if isinstance(key_node, yaml.ScalarNode)
                    else f"a {key_node.id}"
                )
                self._add(loc, key_node, f"keys must be strings, got {got}")
                continue
            child = (*loc, key)
            if key in result:
                self._add(
                    child, key_node, f"duplicate key {key!r} (first on line {self.key_positions[child][0]})"
                )
                continue
            self.key_positions[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            if key in _IMPORT_KEYS:
                self._add(
                    child,
                    key_node,
                    f"{key!r} would choose code by import path; configs name registered components only",
                )
                continue
            if SECRET_KEY.search(key):
                self._add(
                    child,
                    key_node,
                    f"{key!r} looks like a credential; keep credentials in an Airflow connection, never in a config",
                )
                continue
            result[key] = self._value(value_node, child)
        return result

    def _check_string(self, value: str, loc: Loc, node: yaml.Node) -> None:
        if _IMPORT_PATH.match(value.strip()):
            self._add(
                loc, node, f"{_short(repr(value))} is an import path; configs name registered components only"
            )
        elif _ENV_REFERENCE.search(value):
            self._add(
                loc,
                node,
                f"{_short(repr(value))} looks like an environment variable reference; configs are not expanded, "
                "put secrets in an Airflow connection",
            )

    def problems_from(self, exc: ValidationError) -> list[ConfigProblem]:
        problems = []
        for error in exc.errors(include_url=False):
            loc = tuple(error["loc"])
            if error["type"] == "cross_field":
                for sub_loc, message in error["ctx"]["problems"]:
                    problems.append(self._problem(_untagged((*loc, *sub_loc)), message, at_key=False))
            else:
                at_key = error["type"] in ("extra_forbidden", "missing")
                problems.append(self._problem(_untagged(loc), _message(error, loc), at_key))
        return sorted(problems, key=lambda p: (p.line or 0, p.column or 0))

    def _problem(self, loc: Loc, message: str, at_key: bool) -> ConfigProblem:
        # A missing field has no position of its own: use the nearest enclosing key.
        positions = (
            (self.key_positions, self.value_positions)
            if at_key
            else (self.value_positions, self.key_positions)
        )
        for depth in range(len(loc), -1, -1):
            for table in positions:
                if loc[:depth] in table:
                    line, column = table[loc[:depth]]
                    return ConfigProblem(self.source, line, column, _dotted(loc), message)
        return ConfigProblem(self.source, None, None, _dotted(loc), message)


def _yaml_problem(source: str, exc: yaml.MarkedYAMLError) -> ConfigProblem:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark else (None, None)
    if exc.context == "expected a single document in the stream":
        return ConfigProblem(
            source,
            line,
            column,
            "",
            "invalid YAML: a second document starts here; a config file is one YAML document",
        )
    if exc.context and exc.context.startswith("found duplicate anchor") and exc.context_mark:
        anchor = exc.context.split("'")[1] if "'" in exc.context else "?"
        return ConfigProblem(
            source,
            line,
            column,
            "",
            f"invalid YAML: anchor &{_short(anchor)} is defined again (first on line {exc.context_mark.line + 1})",
        )
    return ConfigProblem(source, line, column, "", f"invalid YAML: {_short(str(exc.problem))}")


def _reader_reason(exc: yaml.reader.ReaderError) -> str:
    character = f"#x{exc.character:04x}" if isinstance(exc.character, int) else repr(exc.character)
    return f"unacceptable character {character}: {exc.reason}"


def _short(text: str, limit: int = 80) -> str:
    """A value quoted in a message: a 200 KB scalar must not become a 200 KB message."""
    return text if len(text) <= limit else f"{text[: limit - 1]}… ({len(text):,} characters)"


def _dotted(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _message(error: ErrorDetails, loc: Loc) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        allowed = _fields_at(loc[:-1])
        return f"unknown key {_short(repr(loc[-1]))}{did_you_mean(str(loc[-1]), allowed)}; allowed keys: {', '.join(allowed)}"
    if kind == "missing":
        description = _description_at(loc)
        return "required field is missing" + (f"; expected: {description}" if description else "")
    if kind == "model_type":
        return f"expected a section (a mapping of keys), got {error['input']!r}"
    message = error["msg"].removeprefix("Value error, ")
    if kind == "string_pattern_mismatch" and (description := _description_at(loc)):
        message = f"expected {description[0].lower()}{description[1:].rstrip('.')}"
    if kind != "value_error" and "input" in error and not isinstance(error["input"], dict | list):
        message += f", got {_short(repr(error['input']))}"
    if kind in ("literal_error", "enum"):
        choices = re.findall(r"'([^']*)'", error.get("ctx", {}).get("expected", ""))
        message += did_you_mean(str(error.get("input")), choices)
    return message


def _field_at(loc: Loc) -> tuple[type[BaseModel] | None, str | None, Any]:
    """Walk the models along `loc`: the model owning the last field, its name, and its type."""
    return _walk(loc)[:3]


def _untagged(loc: Loc) -> Loc:
    """`loc` without the tags pydantic puts in it for the member of a discriminated union
    (`data.source.delta.columns` is `data.source.columns` in the file)."""
    tags = _walk(loc)[3]
    return tuple(part for i, part in enumerate(loc) if i not in tags)


def _member(annotation: Any, tag: str) -> type[BaseModel] | None:
    """The member of a union of sections whose one-value Literal field is `tag`."""
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return None
    for member in typing.get_args(annotation):
        if isinstance(member, type) and issubclass(member, BaseModel):
            for info in member.model_fields.values():
                if typing.get_origin(info.annotation) is typing.Literal and typing.get_args(
                    info.annotation
                ) == (tag,):
                    return member
    return None


def _walk(loc: Loc) -> tuple[type[BaseModel] | None, str | None, Any, set[int]]:
    annotation: Any = PipelineConfig
    owner, field, tags = None, None, set()
    for index, part in enumerate(loc):
        annotation = _unwrap(annotation)
        if isinstance(part, str) and (member := _member(annotation, part)) is not None:
            annotation = member
            tags.add(index)
            continue
        if isinstance(part, int):  # list index
            args = typing.get_args(annotation)
            annotation, field = (args[0] if args else None), None
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            owner = annotation
            matches = [(n, i) for n, i in annotation.model_fields.items() if (i.alias or n) == part]
            if not matches:
                return owner, None, None, tags
            field, annotation = matches[0][0], matches[0][1].annotation
        elif typing.get_origin(annotation) is dict:  # free-form map key
            annotation, field = typing.get_args(annotation)[1], None
        else:
            return None, None, None, tags
    return owner, field, annotation, tags


def _unwrap(annotation: Any) -> Any:
    """`X | None` -> X."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return options[0]
    return annotation


def _fields_at(loc: Loc) -> list[str]:
    """The keys allowed in the section at `loc`."""
    section = _unwrap(_field_at(loc)[2])
    if not (isinstance(section, type) and issubclass(section, BaseModel)):
        return []
    return [info.alias or name for name, info in section.model_fields.items()]


def _description_at(loc: Loc) -> str | None:
    owner, field, _ = _field_at(loc)
    if owner is None or field is None:
        return None
    description = field_description(owner, field)
    return " ".join(description.split()) if description else None  # one line per problem
