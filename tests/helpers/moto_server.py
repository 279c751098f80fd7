"""A moto S3 server as a process of its own on 127.0.0.1, for whole stacks (Airflow and its
training jobs reach it through AWS_* variables) and for outages: `pause()` stops the process
(SIGSTOP), so connections hang as they would on a partitioned network, and `resume()` lets it
go on with its buckets intact (moto keeps them in memory).

The session fixture `s3_endpoint` (tests/conftest.py) runs moto in a thread of the test process
instead: enough for jobs started by the test, but a thread cannot be stopped alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import free_port


@dataclass
class MotoServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def wait_ready(self, buckets: tuple[str, ...] = (), timeout: float = 60.0) -> None:
        """Until the server answers; then create `buckets`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"moto_server exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not answer within {timeout:.0f}s") from None
                time.sleep(0.3)
        client = self.client()
        for bucket in buckets:
            client.create_bucket(Bucket=bucket)

    def env(self) -> dict[str, str]:
        """What the Airflow processes and the training jobs need: botocore (and so s3fs) reads
        AWS_ENDPOINT_URL."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def client(self, timeout: float = 5.0):
        import boto3
        import botocore.config

        config = botocore.config.Config(
            connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 2}
        )
        return boto3.client(
            "s3",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
            config=config,
        )

    def pause(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.resume()  # a stopped process would not act on SIGTERM
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_moto_server(log: Path) -> MotoServer:
    """Start the server and return at once; `wait_ready` waits for it (the e2e stack starts
    Airflow meanwhile)."""
    output = open(log, "wb")  # noqa: SIM115 - kept open for the server's lifetime
    port = free_port()
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=output,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return MotoServer(f"http://127.0.0.1:{port}", process, log)
