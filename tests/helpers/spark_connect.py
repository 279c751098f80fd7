"""A real Spark Connect server on 127.0.0.1, for the tests of `validation.engine: spark`.

pyspark's wheel carries the server (jars/spark-connect_2.13-*.jar) but not start-connect-server.sh:
the server is the wheel's own `bin/spark-submit --class ...SparkConnectServer`, a JVM process apart
from the tests (as a production server is apart from the Airflow worker), bound to 127.0.0.1 on a
free port, `local[2]`, without its web UI. Java comes from JAVA_HOME or PATH; there is no skip
when it is missing (CI installs Debian's openjdk-17-jre-headless: scripts/ensure_debian_packages.sh).
Ready means the server logged that it started and its port accepts connections. It is stopped by
its pid (spark-submit execs the JVM, so that pid is the JVM's), then killed if it lingers; it also
gets SIGTERM if the process that started it dies first.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

STARTED = "Spark Connect server started at"


def java_home() -> str:
    """JAVA_HOME, else the installation of the `java` on PATH."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(
            "no java on PATH and no JAVA_HOME: the Spark Connect server needs Java 17 "
            "(scripts/ensure_debian_packages.sh installs Debian's openjdk-17-jre-headless)"
        )
    return str(Path(java).resolve().parents[1])


def _detach_but_die_with_parent() -> None:
    """In the child, before spark-submit execs the JVM: a session of its own (a Ctrl-C of the tests
    does not reach it half-way), and SIGTERM when the process that started it dies, so a killed
    test run leaves no JVM holding its heap (Linux's PR_SET_PDEATHSIG survives the exec)."""
    import ctypes

    os.setsid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG


class SparkConnectServer:
    def __init__(self, port: int, memory: str = "1g"):
        import pyspark

        self.port = port
        self.memory = memory
        self.spark_home = Path(pyspark.__file__).parent
        self.folder = Path(tempfile.mkdtemp(prefix="trainpipe-spark-"))
        self.log = self.folder / "server.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.start_seconds = 0.0

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def __enter__(self) -> SparkConnectServer:
        started = time.perf_counter()
        env = {**os.environ, "JAVA_HOME": java_home(), "SPARK_HOME": str(self.spark_home)}
        env.pop("SPARK_REMOTE", None)  # spark-submit would take it for a client's setting
        command = [
            str(self.spark_home / "bin" / "spark-submit"),
            "--class",
            "org.apache.spark.sql.connect.service.SparkConnectServer",
            "--master",
            "local[2]",
            "--driver-memory",
            self.memory,
            "--conf",
            "spark.connect.grpc.binding.address=127.0.0.1",
            "--conf",
            f"spark.connect.grpc.binding.port={self.port}",
            "--conf",
            "spark.ui.enabled=false",
            "--conf",
            f"spark.local.dir={self.folder}",
            "--conf",
            "spark.sql.shuffle.partitions=4",  # the default 200 costs seconds a GROUP BY on 2 cores
            "spark-internal",
        ]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_detach_but_die_with_parent
            )
        try:
            self._wait_ready(timeout=120)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.perf_counter() - started
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the Spark Connect server exited ({self.process.returncode}):\n{self.tail()}"
                )
            if STARTED in self.log.read_text(errors="replace"):
                with socket.socket() as probe:
                    if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
            time.sleep(0.2)
        raise RuntimeError(f"the Spark Connect server did not start in {timeout:.0f} s:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def rss_kb(self) -> int:
        """The server JVM's resident memory now."""
        assert self.process is not None
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        return 0

    def stop(self) -> None:
        process = self.process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        shutil.rmtree(self.folder, ignore_errors=True)

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
