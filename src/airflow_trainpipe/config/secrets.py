"""Credentials: how configs recognise them (keys and values) and how URIs are shown without them.

Credentials live in Airflow connections and Kubernetes Secrets, never in configs, manifests, logs
or XCom. A config key that names a credential is refused by the loader; a value is refused when it
carries one recognisably (a URI with a password, a private key, a token of a known shape). A URI
that does reach a log line or an extra link (a tracking URI from a connection) has its user-info
and secret query parameters replaced by `***`.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

SECRET_KEY = re.compile(
    r"(password|passwd|secret|token(?!iz)|api_?key|access_?key|credential)", re.IGNORECASE
)
"""A mapping key (config field, environment variable name) that names a credential (`tokenizer`,
the text setting, does not: it names no token)."""

# Shapes of credentials that are unambiguous in a value (no false positive on ordinary settings).
_SECRET_VALUES = (
    (re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"), "a private key"),
    (re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b"), "an AWS access key id"),
    (re.compile(r"\beyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{8,}"), "a JSON Web Token"),
    (re.compile(r"\b(ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}"), "a GitHub token"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "a Slack token"),
    (re.compile(r"\bsk-[A-Za-z0-9_-]{20,}"), "an API secret key"),
)
_SECRET_QUERY = re.compile(r"(password|passwd|secret|token|signature|sig|key|credential)", re.IGNORECASE)


def credential_in_value(value: str) -> str | None:
    """What kind of credential `value` carries, or None."""
    for pattern, kind in _SECRET_VALUES:
        if pattern.search(value):
            return kind
    for token in re.findall(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+", value):
        parts = urlsplit(token)
        if parts.password:
            return "a password in a URI (user:password@host)"
        if any(_SECRET_QUERY.search(key) for key, _ in parse_qsl(parts.query)):
            return "a secret in a URI's query string"
    return None


def redact_uri(uri: str) -> str:
    """`uri` with user-info and secret query values replaced by `***`, fit for logs and links."""
    try:
        parts = urlsplit(uri)
    except ValueError:
        return "***"
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    if "@" not in parts.netloc and not any(_SECRET_QUERY.search(k) for k, _ in pairs):
        return uri  # rebuilt URIs lose details (sqlite:////abs/path): touch only what carries secrets
    netloc = "***@" + parts.netloc.rsplit("@", 1)[1] if "@" in parts.netloc else parts.netloc
    query = urlencode([(k, "***" if _SECRET_QUERY.search(k) else v) for k, v in pairs], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
