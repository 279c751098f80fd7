"""The chaos soak (issue 19): runs of one pipeline on a real stack under a seeded fault schedule.

The stack is tests/integration/conftest.py's (`airflow standalone` as `make up` starts it, a real
`mlflow server`, a moto S3 server as a process of its own). The soak writes a pipeline config
into its dags folder: fraud_detector on one fixed partition (every run trains on the same rows
with the same hyperparameters, so one fault-free weights hash applies to all), checkpoints every
10 steps on `s3://`, 2 ranks, `retries: 3` with a short `retry_delay`. Runs come one at a time
(`max_active_runs: 1`): created by the scheduler (catchup over a daily schedule, `scheduled=True`,
what `make soak` does) or posted through the REST API with distinct logical dates (the shared
e2e stack of the tests, whose scheduler creates no runs).

The first run is the fault-free reference; each other run gets its faults (tests/helpers/chaos.py),
one per try of its train task, in order: each strikes once the try's job has checkpointed at a
drawn step and past where the previous try stopped. `make soak` gives each run one fault; the
suite's small soak strikes one run three times, which recovers through the same retries as three
runs would, for one run's start-up and end. Airflow's retries recover; the soak only watches, then
reads each run's state, the train task's tries and its XCom (the TrainResult: `weights_sha256`,
`steps_recomputed`).

Figures: S = DAG runs in state success; R = the sum of their `steps_recomputed`; W = wall
overhead, the faulted runs' mean train wall time over the reference run's, minus one, where a
run's train wall time spans the first try's start to the last try's end (retry delays included).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import Any
from urllib.parse import quote

import psutil
import yaml

from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.chaos import Bucket, Fault, Job, find_job, inject

PIPELINE = "fraud_soak"
EVERY_STEPS = 10
FIRST_DATE = date(2026, 1, 1)
# The partition every run trains on: a day of its own, larger than the e2e stack's 10,000 rows so
# that training lasts long enough to be struck mid-way (~800 steps at batch 64 on 2 ranks; 10,000
# rows gave 124 steps, ~4 s, faster than a fault can be aimed).
DATA_DAY = date(2026, 2, 1)
DATA_ROWS = 64_000
STRIKE_BY = 600  # faults strike at a checkpoint step up to here, of the ~800 steps
RUN_TIMEOUT_S = 900


def soak_config(
    runs: int,
    *,
    scheduled: bool,
    bucket: str,
    retry_delay: str = "3s",
    expectations: bool = True,
    retries: int = 3,
) -> str:
    """fraud_detector.yaml made into the soak's pipeline (see the module docstring). The suite's
    small soak shortens `retry_delay` and drops the GX expectations (the validate task still
    checks schema, volume and drift): it tests recovery, and both cost every run time."""
    config = yaml.safe_load((EXAMPLE_CONFIGS / "fraud_detector.yaml").read_text())
    config["pipeline"] = PIPELINE
    config["description"] = "The chaos soak's pipeline (tests/helpers/soak.py)."
    config["register"]["model_name"] = PIPELINE
    config["schedule"] = {
        "cron": "@daily",
        "start_date": FIRST_DATE,
        "end_date": FIRST_DATE + timedelta(days=runs - 1),
        "catchup": scheduled,
        "max_active_runs": 1,
        "retries": retries,
        "retry_delay": retry_delay,
    }
    if not expectations:
        config["validation"].pop("expectations", None)
    data = config["data"]
    data["partition"] = f"ds={DATA_DAY.isoformat()}"  # the same rows for every run
    data["wait"] = {"marker": "_SUCCESS", "mode": "poke", "poke_interval": "5s", "timeout": "10m"}
    training = config["training"]
    training["hyperparameters"].update(epochs=2, batch_size=64)
    training["checkpoint"] = {
        "uri": f"s3://{bucket}/soak",
        "every_steps": EVERY_STEPS,
        "keep_last": 2,
        "async": True,
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass
class RunRecord:
    index: int
    run_id: str
    faults: list[Fault]  # struck in order, each on the next try of the train task; [] fault-free
    injected: list[str] = field(default_factory=list)  # what each fault did, or why it did not strike
    struck_at: list[int] = field(default_factory=list)  # the newest complete checkpoint at each strike
    state: str = "?"
    tries: int = 0
    weights_sha256: str | None = None
    steps_recomputed: int | None = None
    resumed_from_step: int | None = None
    train_wall_s: float | None = None
    run_wall_s: float | None = None
    notes: list[str] = field(default_factory=list)


def describe(faults: list[Fault]) -> str:
    return ", ".join(str(f) for f in faults) or "none"


def seconds_between(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


class Soak:
    def __init__(
        self,
        stack: Any,
        plan: list[list[Fault]],
        *,
        scheduled: bool,
        bucket: str,
        rows: int = DATA_ROWS,
        say: Callable[[str], None] = print,
        retry_delay: str = "3s",
        expectations: bool = True,
    ):
        """`plan`: each run's faults, struck on its successive tries ([]: a fault-free run)."""
        self.stack, self.plan, self.scheduled = stack, plan, scheduled
        self.bucket, self.rows, self.say = bucket, rows, say
        # A try for each fault and two to spare (a run can also fail on its own: summarize warns).
        retries = max(3, 2 + max(len(faults) for faults in plan))
        self.config_options = {"retry_delay": retry_delay, "expectations": expectations, "retries": retries}
        self.records: list[RunRecord] = []

    # -- setup --------------------------------------------------------------------------------

    def install(self) -> None:
        """The soak's data, its pipeline's YAML in the dags folder, its DAG parsed and unpaused
        (which, on a scheduling stack, makes the scheduler create the catchup runs)."""
        from airflow_trainpipe.examples.synthetic import write_day

        data = self.stack.home / "data" / "card_transactions"
        if not (data / f"ds={DATA_DAY.isoformat()}" / "_SUCCESS").exists():
            write_day(data.as_uri(), DATA_DAY, self.rows, seed=DATA_DAY.day)
        text = soak_config(
            len(self.plan), scheduled=self.scheduled, bucket=self.bucket, **self.config_options
        )
        (self.stack.configs / f"{PIPELINE}.yaml").write_text(text)
        dag = self.stack.wait_for(
            f"DAG {PIPELINE}", lambda: (d := self.stack.dag(PIPELINE)) and not d["is_stale"] and d, 240
        )
        tags = [t["name"] for t in dag["tags"]]
        assert "trainpipe:broken-config" not in tags, dag["description"]
        response = self.stack.session.patch(
            f"{self.stack.url}/api/v2/dags/{PIPELINE}", json={"is_paused": False}, timeout=30
        )
        assert response.status_code == 200, response.text

    def _runs_path(self, run_id: str = "") -> str:
        return f"/api/v2/dags/{PIPELINE}/dagRuns" + (f"/{quote(run_id, safe='')}" if run_id else "")

    def _next_run(self, index: int) -> str:
        """The plan's run `index`: the scheduler's index-th by logical date, or a new one."""
        if self.scheduled:

            def created() -> str | None:
                runs = self.stack.get(self._runs_path(), order_by="logical_date", limit=100)["dag_runs"]
                return runs[index]["dag_run_id"] if len(runs) > index else None

            return self.stack.wait_for(f"scheduled run #{index}", created, 300)
        logical = datetime.combine(FIRST_DATE + timedelta(days=index), datetime.min.time())
        response = self.stack.session.post(
            f"{self.stack.url}{self._runs_path()}",
            json={"dag_run_id": f"soak_{index:03d}", "logical_date": logical.isoformat() + "Z"},
            timeout=30,
        )
        assert response.status_code == 200, response.text
        return str(response.json()["dag_run_id"])

    # -- one run --------------------------------------------------------------------------------

    def run(self) -> list[RunRecord]:
        self.install()
        for index, faults in enumerate(self.plan):
            run_id = self._next_run(index)
            record = RunRecord(index, run_id, faults)
            self.say(f"run {index + 1}/{len(self.plan)} {run_id}: faults {describe(faults)}")
            self._strike_each(record)
            try:
                record.state = self.stack.wait_for_run(PIPELINE, run_id, RUN_TIMEOUT_S)
            except AssertionError as timeout:  # a stuck run holds the only active-run slot: stop here
                record.state = "timeout"
                record.notes.append(str(timeout)[-3000:])
            self._collect(record)
            self.say(f"  {record.state}: {self._row(record)}")
            self.records.append(record)
            if record.state == "timeout":
                break
        return self.records

    def _bucket(self, run_id: str) -> Bucket:
        from airflow_trainpipe.contracts.train_spec import run_dir_name

        return Bucket(self.stack.s3.client(), self.bucket, f"soak/{PIPELINE}/{run_dir_name(run_id)}")

    def _run_state(self, run_id: str) -> str:
        return str(self.stack.get(self._runs_path(run_id))["state"])

    def _strike_each(self, record: RunRecord) -> None:
        """The run's faults in order, each on a job that the previous one's retry started."""
        bucket, stopped_at = self._bucket(record.run_id), -1
        struck: set[int] = set()  # torchrun pids
        for fault in record.faults:
            said, job = self._strike(record, fault, bucket, struck, stopped_at)
            record.injected.append(said)
            self.say(f"  {said}")
            if job is None:
                return
            struck.add(job.torchrun.pid)
            # The next fault waits for a checkpoint past where this try stopped (a SIGTERMed job
            # saves one as it goes): one its retry wrote, not one left by this try.
            psutil.wait_procs(job.processes(), timeout=60)
            stopped_at = max(bucket.complete_steps(), default=-1)

    def _strike(
        self, record: RunRecord, fault: Fault, bucket: Bucket, struck: set[int], stopped_at: int
    ) -> tuple[str, Job | None]:
        """Wait until a job of the run not struck yet has checkpointed at the fault's
        `after_step` and past `stopped_at`, then strike it."""
        run_id = record.run_id
        last_state_check, deadline = 0.0, time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline:
            job = find_job(run_id, self.stack.home)
            if job is not None and job.torchrun.pid in struck:
                job = None  # the struck job, still ending
            steps = bucket.complete_steps() if job is not None else []
            if job is not None and steps and steps[-1] >= fault.after_step and steps[-1] > stopped_at:
                record.struck_at.append(steps[-1])
                return f"at checkpoint {steps[-1]}: " + inject(fault, job, bucket, self.stack), job
            if time.monotonic() - last_state_check > 2:
                last_state_check = time.monotonic()
                if self._run_state(run_id) in ("success", "failed"):
                    return f"MISSED {fault}: the run ended before the fault could strike", None
            time.sleep(0.1)
        return f"MISSED {fault}: timed out waiting for the checkpoint", None

    def _collect(self, record: RunRecord) -> None:
        dag_run = self.stack.get(self._runs_path(record.run_id))
        record.run_wall_s = seconds_between(dag_run.get("start_date"), dag_run.get("end_date"))
        tries = self.stack.get(f"{self._runs_path(record.run_id)}/taskInstances/train/tries")
        attempts = [t for t in tries["task_instances"] if t.get("start_date")]
        record.tries = max((t["try_number"] for t in attempts), default=0)
        if attempts:
            record.train_wall_s = seconds_between(
                min(t["start_date"] for t in attempts), max(t["end_date"] or "" for t in attempts) or None
            )
        response = self.stack.session.get(
            f"{self.stack.url}{self._runs_path(record.run_id)}/taskInstances/train/xcomEntries/return_value",
            timeout=30,
        )
        if response.status_code == 200:
            result = response.json()["value"]
            record.weights_sha256 = result["weights_sha256"]
            record.steps_recomputed = result["steps_recomputed"]
            record.resumed_from_step = result["resumed_from_step"]
        if any(f.kind == "corrupt_checkpoint" for f in record.faults) and record.tries > 1:
            # The retries' logs in order, each fetched only until one says it.
            logs = (self._train_log(record.run_id, number) for number in range(2, record.tries + 1))
            if any("skipping corrupt checkpoint" in log for log in logs):
                record.notes.append("the retry skipped the corrupt checkpoint")
            else:
                record.notes.append("NO 'skipping corrupt checkpoint' in the retry's log")
        if record.state != "success":
            record.notes.append(self.stack.task_report(PIPELINE, record.run_id)[-3000:])

    def _train_log(self, run_id: str, try_number: int) -> str:
        response = self.stack.session.get(
            f"{self.stack.url}{self._runs_path(run_id)}/taskInstances/train/logs/{try_number}",
            headers={"Accept": "application/json"},
            timeout=30,
        )
        content = response.json().get("content", []) if response.ok else []
        return "\n".join(e.get("event", str(e)) if isinstance(e, dict) else str(e) for e in content)

    # -- report ---------------------------------------------------------------------------------

    @staticmethod
    def _row(r: RunRecord) -> str:
        wall = f"{r.train_wall_s:.1f}" if r.train_wall_s is not None else "-"
        return (
            f"tries {r.tries}, train wall {wall}s, resumed from {r.resumed_from_step}, "
            f"recomputed {r.steps_recomputed}, weights {(r.weights_sha256 or '-')[:12]}"
        )


@dataclass
class Summary:
    lines: list[str]
    ok: bool


def summarize(records: list[RunRecord], planned: int) -> Summary:
    """The per-run table, the per-fault figures, and the last line
    `soak: S/N runs succeeded, R steps recomputed, W% wall overhead` (N: the `planned` runs; a
    run that timed out ends the soak, and the runs it kept from starting count as not succeeded)."""
    reference = records[0]
    assert not reference.faults, "the first run is the fault-free reference"
    header = f"{'#':>3} {'run_id':<36} {'fault':<34} {'state':<8} {'tries':>5} {'recomp':>6} {'resumed':>7} {'train_s':>8} {'weights':<12}"
    lines = [header, "-" * len(header)]
    for r in records:
        wall = f"{r.train_wall_s:.1f}" if r.train_wall_s is not None else "-"
        lines.append(
            f"{r.index + 1:>3} {r.run_id:<36} {describe(r.faults):<34} {r.state:<8} {r.tries:>5} "
            f"{r.steps_recomputed if r.steps_recomputed is not None else '-':>6} "
            f"{r.resumed_from_step if r.resumed_from_step is not None else '-':>7} {wall:>8} "
            f"{(r.weights_sha256 or '-')[:12]:<12}"
        )
        lines += [f"      {said}" for said in r.injected] + [f"      note: {n}" for n in r.notes]
    succeeded = [r for r in records if r.state == "success"]
    same = [r for r in succeeded if r.weights_sha256 == reference.weights_sha256]
    missed = [said for r in records for said in r.injected if said.startswith("MISSED")]
    lines.append("")
    for kind in sorted({f.kind for r in records for f in r.faults if f.kind}):
        runs = [r for r in records if any(f.kind == kind for f in r.faults)]
        done = [r for r in runs if r.state == "success"]
        recomputed = [r.steps_recomputed or 0 for r in done]
        lines.append(
            f"{kind:<20} runs {len(runs)}, succeeded {len(done)}, tries {[r.tries for r in runs]}, "
            f"steps recomputed {recomputed}"
        )
    lines.append(
        f"weights: {len(same)} of {len(succeeded)} succeeded runs equal the fault-free run's "
        f"({(reference.weights_sha256 or '-')[:16]}); faults that never struck: {len(missed)}"
    )
    faulted = [r for r in succeeded if r.faults and r.train_wall_s is not None]
    overhead = (
        100 * (sum(r.train_wall_s or 0 for r in faulted) / len(faulted) / reference.train_wall_s - 1)
        if faulted and reference.train_wall_s
        else float("nan")
    )
    if reference.tries > 1:
        # Nothing of the soak's struck it: something else on the machine did. Its weights still
        # count (a resume is bit-exact); its wall time is no fault-free baseline, so W reads low.
        lines.append(
            f"WARNING: the reference run took {reference.tries} tries with no fault of the soak's "
            f"(see its train task log): W's baseline includes that retry"
        )
    recomputed_total = sum(r.steps_recomputed or 0 for r in succeeded)
    lines.append(
        f"soak: {len(succeeded)}/{planned} runs succeeded, {recomputed_total} steps recomputed, "
        f"{overhead:.0f}% wall overhead"
    )
    return Summary(lines, ok=len(succeeded) == planned == len(same))
