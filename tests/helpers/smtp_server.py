"""A real SMTP server on 127.0.0.1 (aiosmtpd) whose inbox the tests read: what Airflow's SMTP
connection sends arrives here as parsed e-mails."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import EmailMessage
from email.policy import default

from tests.conftest import free_port


@dataclass
class Received:
    sender: str
    recipients: list[str]
    message: EmailMessage

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def html(self) -> str:
        part = self.message.get_body(preferencelist=("html", "plain"))
        return part.get_content() if part is not None else ""


@dataclass
class Inbox:
    received: list[Received] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd's handler hook
        message = message_from_bytes(envelope.content, policy=default)
        with self._lock:
            self.received.append(Received(envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 Message accepted for delivery"

    def subjects(self) -> list[str]:
        with self._lock:
            return [r.subject for r in self.received]

    def wait_for(self, fragment: str, timeout: float = 60) -> Received:
        """The first e-mail whose subject contains `fragment`, waiting up to `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                for received in self.received:
                    if fragment in received.subject:
                        return received
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no e-mail with {fragment!r} in its subject after {timeout:.0f}s; got {self.subjects()}"
                )
            time.sleep(0.2)


class SmtpServer:
    """aiosmtpd's Controller on a free loopback port; `connection_json()` is the Airflow connection."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.inbox = Inbox()
        self.port = free_port()
        self._controller = Controller(self.inbox, hostname="127.0.0.1", port=self.port)

    def __enter__(self) -> SmtpServer:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()

    def connection_json(self) -> str:
        return json.dumps(
            {
                "conn_type": "smtp",
                "host": "127.0.0.1",
                "port": self.port,
                # Plain SMTP on loopback: no TLS/SSL, no login; one try, so a bug shows at once.
                "extra": {"disable_ssl": True, "disable_tls": True, "retry_limit": 0, "timeout": 10},
            }
        )
