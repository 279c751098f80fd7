"""The work loading a config does, counted: YAML events composed and bytes read from the file.

A limit must stop the work early. Timing that (even in CPU seconds) makes a test that a busy
or slow machine can fail: the file at every limit took 1.15 s of CPU against a 1.0 s bound in
a CI run. Counting is exact on every machine, and says what a limit bounds: the composer pulls
events from libyaml one at a time, so events composed is how far the text was parsed, and a
refused file is never walked, validated or expanded past that point. How fast the worst files
load is measured in `make bench` (benchmarks/run.py, "Config parsing").
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from airflow_trainpipe.config import files, limits

# Each node is at least one event (a collection two: start and end), plus the stream's and
# the document's start and end: a file refused at the node limit has composed at most this.
MAX_EVENTS = 2 * (limits.MAX_NODES + 1) + 4


# The valid file that costs most within the limits: `example` with MAX_NODES - 400 more nodes
# (its own ~300 stay under the node limit), padded with a comment to MAX_FILE_BYTES. Its tags
# move to `x_tags`, an unknown key, so validation still has one problem to report.
AT_EVERY_LIMIT_NODES = limits.MAX_NODES - 400


def at_every_limit(example: str) -> str:
    filler = "tags: [" + ", ".join(["t"] * AT_EVERY_LIMIT_NODES) + "]\n"
    text = example.replace("tags: [", "x_tags: [") + filler
    return "#" * (limits.MAX_FILE_BYTES - len(text.encode()) - 1) + "\n" + text


@dataclass
class Work:
    events: int = 0  # YAML events the limited composer pulled from the parser
    bytes_read: int = 0  # bytes read from config files


class _CountedFile:
    def __init__(self, handle: Any, work: Work):
        self._handle = handle
        self._work = work

    def __enter__(self) -> _CountedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._handle.read(size)
        self._work.bytes_read += len(data)
        return data


@contextmanager
def counted_work(monkeypatch: pytest.MonkeyPatch) -> Iterator[Work]:
    work = Work()
    get_event = limits._LimitedLoader.get_event

    def counted_get_event(loader: Any) -> Any:
        work.events += 1
        return get_event(loader)

    def counted_open(*args: Any, **kwargs: Any) -> _CountedFile:
        return _CountedFile(builtins.open(*args, **kwargs), work)

    with monkeypatch.context() as patch:
        patch.setattr(limits._LimitedLoader, "get_event", counted_get_event)
        # files.py reads through the builtin open; a module global of that name shadows it.
        patch.setattr(files, "open", counted_open, raising=False)
        yield work
