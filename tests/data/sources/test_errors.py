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
