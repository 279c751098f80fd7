"""Reading a config file: only a regular file within the size limit, as UTF-8 text.

What the DAG processor opens is whatever sits in the dags folder: a directory named `x.yaml`,
a FIFO (opening it for reading would block the processor until a writer comes), a symlink
loop, a dangling symlink, a huge file, bytes that are not UTF-8. Each is a ConfigError naming
the file and what it is; the file's kind and size come from the open descriptor itself, so a
file cannot be swapped between the check and the read, and a huge file costs one stat.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import typing
from pathlib import Path

from airflow_trainpipe.config.limits import MAX_FILE_BYTES, size_problem
from airflow_trainpipe.core.exceptions import ConfigError, ConfigProblem

log = logging.getLogger(__name__)

# Opening a FIFO for reading would block until a writer comes: the DAG processor would hang.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)
_FILE_KINDS = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a device",
    stat.S_IFBLK: "a device",
}


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def printable_name(name: str | Path) -> str:
    """A file name as users see it and Airflow stores it: printable UTF-8.

    A name is any bytes but `/` and NUL; undecodable bytes and control characters are shown
    escaped (`caf\\xe9.yaml`, `new\\nline.yaml`), never printed raw or as lone surrogates.
    """
    text = os.fsencode(name).decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode(), text)


def read_config_text(path: str | Path, source: str | None = None) -> str:
    """A config file's text; ConfigError naming it (`source`, default the path) if unreadable.

    Only a regular file of at most MAX_FILE_BYTES is read: its kind and size come from the
    open descriptor itself, so a directory, a FIFO or a huge file costs one stat.
    """
    source = source or str(path)
    try:
        return _read_text(path, source)
    except ConfigError:
        raise
    except Exception as exc:
        log.error("reading pipeline config %s failed unexpectedly", source, exc_info=exc)
        raise ConfigError.unexpected(source, "reading it", exc) from exc


def _read_text(path: str | Path, source: str) -> str:
    def unreadable(message: str) -> ConfigError:
        return ConfigError([ConfigProblem(source, None, None, "", f"cannot read file: {message}")])

    try:
        fd = os.open(path, _OPEN_FLAGS)
    except (OSError, ValueError) as exc:
        raise _open_failure(path, exc, unreadable) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise unreadable(
                f"it is {_FILE_KINDS.get(stat.S_IFMT(info.st_mode), 'not a regular file')}, not a config file"
            )
        if (too_big := size_problem(info.st_size)) is None:
            with open(fd, "rb", closefd=False) as handle:
                data = handle.read(MAX_FILE_BYTES + 1)  # a file that grows while read is cut here
            too_big = size_problem(len(data))
    finally:
        os.close(fd)
    if too_big:
        raise ConfigError([ConfigProblem(source, None, None, "", too_big)])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if data.startswith((b"\xff\xfe", b"\xfe\xff")):
            raise unreadable(
                "it is UTF-16 text (it starts with a UTF-16 byte order mark); save it as UTF-8"
            ) from None
        line, column = offset_position(data, exc.start)
        raise unreadable(
            f"not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column} ({exc.reason}); "
            "save the file as UTF-8"
        ) from None


def _open_failure(
    path: str | Path, exc: Exception, unreadable: typing.Callable[[str], ConfigError]
) -> ConfigError:
    if isinstance(exc, OSError) and exc.errno == errno.ELOOP:
        return unreadable("it is a symlink loop")
    if isinstance(exc, FileNotFoundError) and os.path.islink(path):
        return unreadable(f"it is a symlink to {os.readlink(path)!r}, which does not exist")
    return unreadable(str(exc))


def offset_position(data: bytes | str, offset: int) -> tuple[int, int]:
    """Line and column (1-based, in characters) of an offset into `data`."""
    if isinstance(data, bytes):
        start = data.rfind(b"\n", 0, offset) + 1
        return data.count(b"\n", 0, offset) + 1, len(data[start:offset].decode("utf-8", "replace")) + 1
    start = data.rfind("\n", 0, offset) + 1
    return data.count("\n", 0, offset) + 1, offset - start + 1
