"""What a source's error says: HTTP 403 as a status, not digits that happen to hold it."""

from __future__ import annotations

import pytest

from airflow_trainpipe.data.sources.errors import says_forbidden


@pytest.mark.parametrize(
    ("text", "forbidden"),
    [
        ("Client error with status 403 Forbidden: <Code>AccessDenied</Code>", True),
        ("HTTP 403", True),
        ("403: signature expired", True),
        ("status=403", True),
        # Ports, addresses and durations of a storage that refused the connection (ECONNREFUSED):
        # another try may reach it.
        ("HTTPConnection(host='127.0.0.1', port=40379): Connection refused", False),
        ("GET http://127.0.0.1:57401/lake/_delta_log/_last_checkpoint in 1.840371s, after 10 retries", False),
        ("GET http://10.0.40.3:9000/lake in 1.403s: tcp connect error", False),
        ("after 1403 ms", False),
    ],
)
def test_403_is_a_status_not_digits_of_a_port_an_address_or_a_duration(text: str, forbidden: bool) -> None:
    assert says_forbidden(text) is forbidden


@pytest.mark.parametrize(
    "text",
    [
        "Server error: 502 Bad Gateway: dial tcp: lookup catalog on 10.96.0.10:53: no such host",
        "HTTPConnectionPool(host='catalog', port=8181): Failed to resolve 'catalog' "
        "([Errno -2] Name or service not known)",
        "Generic S3 error: error sending request: dns error: failed to lookup address information",
    ],
)
def test_a_host_that_did_not_resolve_is_asked_again_by_every_reader(text: str) -> None:
    """Iceberg's refusal word "no such " (a missing file or key) also matched Go's "no such host":
    a DNS outage then failed the run for good instead of being retried."""
    from airflow_trainpipe.data.sources import delta, iceberg
    from airflow_trainpipe.data.sources.errors import SourceUnavailable

    for exc in (OSError(text), ConnectionError(text)):
        assert isinstance(iceberg._classified(exc, "lake", "opening"), SourceUnavailable), exc
        assert isinstance(delta._classified(exc, "s3://lake/t", "opening"), SourceUnavailable), exc
    # The words still refuse what they were for, and a 403 stays final beside a host name.
    assert not isinstance(
        iceberg._classified(OSError("no such key: t/data/0.parquet"), "lake", "opening"), SourceUnavailable
    )
    assert not isinstance(
        iceberg._classified(OSError(f"HTTP 403 from {text}"), "lake", "opening"), SourceUnavailable
    )
