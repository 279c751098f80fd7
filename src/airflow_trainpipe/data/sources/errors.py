"""The errors of a source kind: light (stdlib only), so the feature-store client, which runs on
workers without pyarrow or pydantic loaded, can subclass them."""

from __future__ import annotations

import re

from airflow_trainpipe.core.exceptions import TrainpipeError

# HTTP 403 as a status, not digits of a port, an address or a duration that hold them: "port=40379",
# "in 1.840371s" and "in 1.403s" are messages of a storage that refused the connection, and another
# try may reach it.
_FORBIDDEN_STATUS = re.compile(r"(?<![0-9.])403(?![0-9])")
# A host name that did not resolve: a DNS outage, or a service not registered yet, which another
# try may find. Go's resolver says "no such host" (a REST catalog or a proxy in Go passes it on),
# which a reader's refusal word "no such " would otherwise catch.
_UNRESOLVED_HOST = (
    "no such host",
    "name or service not known",
    "temporary failure in name resolution",
    "could not resolve host",
    "couldn't resolve host",
    "nodename nor servname provided",
    "failed to lookup address information",
)


def says_forbidden(text: str) -> bool:
    """Whether a storage or catalog error's message gives HTTP 403 (Forbidden) as its status."""
    return _FORBIDDEN_STATUS.search(text) is not None


def is_refusal(exc: BaseException, text: str, words: tuple[str, ...]) -> bool:
    """Whether the storage or catalog refused (another try would only repeat it), whatever the
    exception's class says: a PermissionError, HTTP 403, or one of the reader's `words` (lower
    case) in the message `text`. A host name that did not resolve is no refusal, whatever words
    its message holds."""
    lowered = text.lower()
    if isinstance(exc, PermissionError) or says_forbidden(text):
        return True
    if any(phrase in lowered for phrase in _UNRESOLVED_HOST):
        return False
    return any(word in lowered for word in words)


class SourceError(TrainpipeError):
    """The source cannot give the run's rows: a wrong query, a missing connection, no rows."""


class SourceUnavailable(SourceError):
    """The database could not be reached or dropped the connection: another try may succeed."""

    retryable = True
