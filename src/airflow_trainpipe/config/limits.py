"""Limits on a config file's size and shape, checked before the work each one guards.

A real config is a few KB (the examples: 2.8 and 3.4 KB), nests 6 or 7 levels and has ~300
nodes and a handful of aliases. YAML lets a small file cost without bound: aliases of aliases
expand exponentially ("billion laughs", `<<:` merge chains: 200 bytes, 10^9 nodes), an alias
inside its own anchor is a cycle (`&x [*x]`), and deep nesting overflows recursion: Python's
near 1,000 levels, libyaml's C composer crashes the whole process (SIGSEGV) near 100,000, and
its scanner is quadratic on the way (20,000 levels: 2.5 s). So:

- the file size is checked on the open file descriptor, before reading (`MAX_FILE_BYTES`);
- the document is composed by `LimitedComposer`, which counts on the event stream before it
  descends: nesting depth, aliases, and nodes as the walk will see them, an alias counting as
  the whole subtree it stands for (computed, never expanded). Parsing stops at the first
  limit, so a hostile file costs at most the limits, and the later walk, validation and error
  messages work on a bounded document.

The limits are constants, not settings: one file must load the same in the DAG processor, the
CLI, a worker and a training pod, which do not share an environment.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent, ScalarEvent

MAX_FILE_BYTES = 256 * 1024
"""Largest config file, in bytes of UTF-8 (75x the largest example)."""

MAX_DEPTH = 32
"""Deepest nesting of mappings and sequences, aliases expanded (the examples: 7)."""

MAX_ALIASES = 100
"""Most `*alias` references in one file (a config needs a few)."""

MAX_NODES = 10_000
"""Most nodes (keys, values, collections) once aliases are expanded (the examples: ~300)."""


class LimitExceeded(Exception):
    """A limit stopped composing; `message` says which, with the observed value."""

    def __init__(self, message: str, mark: Any):
        super().__init__(message)
        self.message = message
        self.mark = mark


def size_problem(size: int) -> str | None:
    if size > MAX_FILE_BYTES:
        return f"file is {size:,} bytes, over the limit of {MAX_FILE_BYTES:,} bytes"
    return None


class LimitedComposer(Composer):
    """PyYAML's composer with the limits checked at each event, before descending into it.

    An anchored node records its expanded size and height once composed; an alias adds them
    to the running totals, so an alias bomb is refused at the first alias that crosses
    `MAX_NODES`, without building anything beyond what the file itself spells out.
    """

    def __init__(self) -> None:
        super().__init__()
        self._depth = 0  # collections open around the node being composed
        self._deepest = 0  # deepest level reached inside the innermost open node
        self._nodes = 0
        self._aliases = 0
        self._expanded: dict[str, tuple[int, int]] = {}  # anchor -> (nodes, height)
        self._open: set[str] = set()  # anchors of the nodes being composed

    # Called once per node of every cold parse: the common path is kept to a few comparisons.
    def compose_node(self, parent: Any, index: Any) -> Any:
        event: Any = self.peek_event()  # type: ignore[attr-defined]  # the Loader it is mixed into has it
        kind = event.__class__
        if kind is AliasEvent:
            self._alias(event)
            return super().compose_node(parent, index)
        depth = self._depth + 1
        self._nodes += 1
        if depth > MAX_DEPTH or self._nodes > MAX_NODES:
            self._refuse(depth, event, None)
        anchor = event.anchor
        if kind is ScalarEvent:
            if depth > self._deepest:
                self._deepest = depth
            if anchor is not None:
                self._expanded[anchor] = (1, 1)
            return super().compose_node(parent, index)
        outer_nodes, outer_deepest = self._nodes - 1, self._deepest
        self._depth = self._deepest = depth
        if anchor is not None:
            self._open.add(anchor)
        node = super().compose_node(parent, index)
        if anchor is not None:
            self._open.discard(anchor)
            self._expanded[anchor] = (self._nodes - outer_nodes, self._deepest - depth + 1)
        if outer_deepest > self._deepest:
            self._deepest = outer_deepest
        self._depth = depth - 1
        return node

    def _alias(self, event: AliasEvent) -> None:
        if event.anchor in self._open:
            raise LimitExceeded(
                f"alias *{event.anchor} refers to a node that contains it; a config cannot be recursive",
                event.start_mark,
            )
        self._aliases += 1
        if self._aliases > MAX_ALIASES:
            raise LimitExceeded(
                f"alias {self._aliases} (*{event.anchor}) is over the limit of {MAX_ALIASES} aliases per file",
                event.start_mark,
            )
        # An undefined alias counts as one node here; the composer then reports it.
        nodes, height = self._expanded.get(event.anchor or "", (1, 1))
        reach = self._depth + height
        self._nodes += nodes
        if reach > MAX_DEPTH or self._nodes > MAX_NODES:
            self._refuse(reach, event, event.anchor)
        if reach > self._deepest:
            self._deepest = reach

    def _refuse(self, reach: int, event: Any, alias: str | None) -> None:
        if reach > MAX_DEPTH:
            through = f" (through alias *{alias})" if alias else ""
            raise LimitExceeded(
                f"nesting depth {reach} is over the limit of {MAX_DEPTH} levels{through}", event.start_mark
            )
        counted = (
            f"{self._nodes:,} nodes once alias *{alias} is expanded" if alias else f"{self._nodes:,} nodes"
        )
        raise LimitExceeded(f"{counted} are over the limit of {MAX_NODES:,}", event.start_mark)


# libyaml's parser is ~5x faster than the pure-Python one and keeps the same line marks.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _LimitedLoader(LimitedComposer, _SAFE_LOADER):  # type: ignore[misc, valid-type]
    def __init__(self, stream: str):
        _SAFE_LOADER.__init__(self, stream)  # parser, safe constructor, resolver
        LimitedComposer.__init__(self)


def compose_limited(text: str) -> yaml.Node | None:
    """The single YAML document of `text` as nodes; LimitExceeded at the first limit crossed.

    The events come from libyaml (C, iterative: no recursion however deep the text nests);
    composing is PyYAML's Python composer, which checks each limit before going deeper.
    """
    loader = _LimitedLoader(text)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()
