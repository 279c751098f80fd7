"""Credentials are recognised in config values and kept out of logged or linked URIs."""

from __future__ import annotations

import pytest

from airflow_trainpipe.config.secrets import credential_in_value, redact_uri


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        ("https://svc:pa55@mlflow.example.com", "a password in a URI"),
        ("postgresql://u:p@db:5432/x", "a password in a URI"),
        ("https://mlflow.example.com/?token=abc", "a secret in a URI's query string"),
        ("AKIAIOSFODNN7EXAMPLE", "an AWS access key id"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE", "a private key"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36P", "a JSON Web Token"),
        ("ghp_abcdefghijklmnopqrstuvwxyz0123456789", "a GitHub token"),
    ],
)
def test_credentials_in_values_are_recognised(value: str, kind: str) -> None:
    assert credential_in_value(value).startswith(kind)


@pytest.mark.parametrize(
    "value",
    [
        "https://mlflow.example.com",
        "http://minio:9000",
        "s3://bucket/prefix",
        "us-east-1",
        "true",
        "1",
        "https://user@mlflow.example.com",  # a user name alone is not a credential
        "https://example.com/?region=eu",
        "ACCESS",
        "some-long-but-ordinary-setting-value-1234567890",
    ],
)
def test_ordinary_values_pass(value: str) -> None:
    assert credential_in_value(value) is None


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("https://svc:pa55@mlflow.example.com:8443/x", "https://***@mlflow.example.com:8443/x"),
        ("https://token@mlflow.example.com", "https://***@mlflow.example.com"),
        (
            "https://mlflow.example.com/?token=abc&region=eu",
            "https://mlflow.example.com/?token=***&region=eu",
        ),
        ("sqlite:////var/mlflow.db", "sqlite:////var/mlflow.db"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
    ],
)
def test_redacted_uris_keep_everything_but_credentials(uri: str, shown: str) -> None:
    assert redact_uri(uri) == shown
