"""The faults of the chaos soak (tests/helpers/soak.py): real signals to the real processes of a
running pipeline, and real bytes changed in its S3 bucket. Nothing here re-runs a task: after a
fault, Airflow's retries (and the training job's checkpoint-resume) do the recovering.

A run's training job is found by its processes: the torchrun launcher whose `--spec` file names
the DAG run, its ranks (`airflow_trainpipe.runtime.train`), and torchrun's parent, the Airflow 3
task-runner process that executes the `train` task (the child of the task supervisor).
"""

from __future__ import annotations

import contextlib
import json
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

FAULTS = ("rank_sigkill", "job_sigterm", "corrupt_checkpoint", "mlflow_restart", "s3_outage", "task_kill")
ENTRYPOINT = "airflow_trainpipe.runtime.train"


@dataclass(frozen=True)
class Fault:
    kind: str | None  # one of FAULTS; None: the fault-free run
    after_step: int  # fires once the run's newest complete checkpoint is at or past this step
    pick: int  # rank_sigkill: the rank; corrupt_checkpoint: which of the checkpoint's files
    seconds: float  # s3_outage: how long the server is stopped; mlflow_restart: how long it is down

    def __str__(self) -> str:
        if self.kind is None:
            return "none"
        detail = {
            "rank_sigkill": f"rank {self.pick}",
            "corrupt_checkpoint": f"file #{self.pick}",
            "s3_outage": f"{self.seconds:.1f}s",
            "mlflow_restart": f"down {self.seconds:.1f}s",
        }.get(self.kind)
        return f"{self.kind}@{self.after_step}" + (f" ({detail})" if detail else "")


def fault_schedule(
    runs: int, seed: int, every_steps: int, strike_by: int, kinds: list[str | None] | None = None
) -> list[Fault]:
    """The first run is fault-free (the reference); the others get the six faults in rounds, each
    round shuffled, so every kind comes up about equally often. `kinds` fixes the kinds instead;
    when (a checkpoint step up to `strike_by`) and where each fault strikes is drawn from
    `random.Random(seed)` either way."""
    rng = random.Random(seed)
    if kinds is None:
        kinds = [None]
        while len(kinds) < runs:
            order = list(FAULTS)
            rng.shuffle(order)
            kinds += order
    faults = []
    for kind in kinds[:runs]:
        # Two complete checkpoints before a corruption: the retry must have an older one to fall back to.
        first = 2 if kind == "corrupt_checkpoint" else 1
        faults.append(
            Fault(
                kind,
                every_steps * rng.randint(first, strike_by // every_steps),
                rng.randrange(2),
                round(rng.uniform(3, 8), 1),
            )
        )
    return faults


@dataclass
class Job:
    """The processes of one training job (one try of the train task)."""

    torchrun: psutil.Process
    ranks: dict[int, psutil.Process]
    task: psutil.Process  # the Airflow task runner: torchrun's parent

    def processes(self) -> list[psutil.Process]:
        return [self.torchrun, *self.ranks.values()]


def find_job(run_id: str, home: Path) -> Job | None:
    """The running training job of DAG run `run_id` whose TRAINPIPE_HOME is `home`."""
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "torch.distributed.run" not in cmdline or ENTRYPOINT not in cmdline or "--spec" not in cmdline:
            continue
        try:
            spec_arg = cmdline[cmdline.index("--spec") + 1]
            spec = json.loads(Path(spec_arg.removeprefix("@")).read_text())
            if spec["run_id"] != run_id or process.environ().get("TRAINPIPE_HOME") != str(home):
                continue
            ranks = {
                int(child.environ()["RANK"]): child
                for child in process.children(recursive=True)
                if ENTRYPOINT in child.cmdline() and "RANK" in child.environ()
            }
            parent = process.parent()
        except (OSError, ValueError, KeyError, psutil.Error):
            continue  # it ended (or is just starting) while we looked
        if parent is not None:
            return Job(process, ranks, parent)
    return None


class Bucket:
    """The run's checkpoints in the moto bucket, read and changed with boto3."""

    def __init__(self, client: Any, bucket: str, run_dir_key: str):
        self.client, self.bucket = client, bucket
        self.prefix = f"{run_dir_key}/checkpoints/"

    def complete_steps(self) -> list[int]:
        """Steps of the checkpoints that have their COMPLETE.json marker, oldest first."""
        listing = self.client.list_objects_v2(Bucket=self.bucket, Prefix=self.prefix)
        return sorted(
            int(key.split("/")[-2].removeprefix("step_"))
            for key in (o["Key"] for o in listing.get("Contents", []))
            if key.endswith("/COMPLETE.json") and key.split("/")[-2].startswith("step_")
        )

    def corrupt_newest(self, pick: int) -> str:
        """Flip bytes in the middle of one file of the newest complete checkpoint (same size, so
        only the sha256 in its marker can tell). Returns what was changed."""
        step = self.complete_steps()[-1]
        base = f"{self.prefix}step_{step:09d}/"
        marker = json.loads(
            self.client.get_object(Bucket=self.bucket, Key=base + "COMPLETE.json")["Body"].read()
        )
        names = sorted(marker["files"])
        name = names[pick % len(names)]
        data = bytearray(self.client.get_object(Bucket=self.bucket, Key=base + name)["Body"].read())
        middle = len(data) // 2
        for i in range(middle, min(middle + 8, len(data))):
            data[i] ^= 0xFF
        self.client.put_object(Bucket=self.bucket, Key=base + name, Body=bytes(data))
        return f"flipped 8 bytes of step_{step:09d}/{name}"


def signal_and_wait(processes: list[psutil.Process], sig: int, timeout: float = 30) -> None:
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.send_signal(sig)
    psutil.wait_procs(processes, timeout=timeout)


def inject(fault: Fault, job: Job, bucket: Bucket, stack: Any) -> str:
    """Strike `job` (and the stack's servers) with `fault`; returns what was done."""
    from tests.helpers.mlflow_server import restart_mlflow_server

    kind = fault.kind
    if kind == "rank_sigkill":
        rank = job.ranks[fault.pick % len(job.ranks)]
        rank.send_signal(signal.SIGKILL)
        return f"SIGKILL rank pid {rank.pid}"
    if kind == "job_sigterm":
        job.torchrun.send_signal(signal.SIGTERM)
        return f"SIGTERM torchrun pid {job.torchrun.pid}"
    if kind == "task_kill":
        job.task.send_signal(signal.SIGKILL)
        return f"SIGKILL task runner pid {job.task.pid}"
    if kind == "corrupt_checkpoint":
        # The job dies first, so that no newer marker appears after the corruption.
        signal_and_wait(job.processes(), signal.SIGKILL)
        return "SIGKILL job, " + bucket.corrupt_newest(fault.pick)
    if kind == "mlflow_restart":
        started = time.monotonic()
        restart_mlflow_server(stack.mlflow, down_s=fault.seconds)
        return f"mlflow server restarted, unavailable {time.monotonic() - started:.1f}s"
    if kind == "s3_outage":
        stack.s3.pause()
        try:
            time.sleep(fault.seconds)
        finally:
            stack.s3.resume()
        return f"S3 server stopped for {fault.seconds:.1f}s"
    raise ValueError(f"unknown fault {kind!r}")
