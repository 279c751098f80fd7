"""The many-pipelines soak (issue 51): N pipelines triggered within a minute on one Airflow.

The stack is tests/integration/conftest.py's `running_stack` on PostgreSQL (what `make up DB=postgres`
starts: `airflow standalone` with LocalExecutor, a real `mlflow server`, all on 127.0.0.1). The soak
writes N pipeline configs made from the examples into its dags folder, a rotation of kinds and
sources: binary on files, on SQL and on Delta; multiclass text (a transformer encoder); ranking.
All train in the default training pool (`trainpipe pools --apply`: the host's cores as slots).

Three seeded faults, as in the chaos soak (tests/helpers/chaos.py): a rank SIGKILLed once its job
has a complete checkpoint; the MLflow server down for a few seconds while a job trains; a bad day,
one pipeline's partition with nulls where its expectations forbid them, which validation must stop
before training. Airflow's retries
recover the first two; the third run must fail at validate_data and register nothing.

While the runs drain, a sampler counts the training ranks running (processes of the training
entrypoint under this stack's TRAINPIPE_HOME) and the host's memory in use. Afterwards every run
is checked: it ended as its data and fault say; the train tasks never held more slots at once than
the pool has; each `@champion` is a version whose gate said promote, registered from its own
pipeline's MLflow run; each trained snapshot's manifest hashes to its digest and every file to its
sha256; each pipeline's checkpoints hold its own runs only.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psutil
import yaml

from tests.conftest import EXAMPLE_CONFIGS
from tests.helpers.chaos import ENTRYPOINT, find_job
from tests.helpers.soak import seconds_between

DAY = date.today() - timedelta(days=1)  # inside the 7-day windows the SQL and Delta tables hold
EVERY_STEPS = 20
RUN_TIMEOUT_S = 3600
BAD_DATA = "data/card_transactions_bad"  # the bad day's pipeline reads its own copy of the rows
# Fails expect_column_values_to_not_be_null. Not a drift: drift needs a validated day before.
BAD_DAY_PROBLEM = "nulls:amount:0.3"


@dataclass(frozen=True)
class Template:
    """One kind of pipeline of the fleet: its example, what it is, its data."""

    example: str
    kind: str  # what the issue calls it: binary, text, ranking
    source: str  # files, sql, delta
    data_kind: str | None  # write_day's kind for file sources; None: the table `make up` fills
    rows: int
    ranks: int
    epochs: int


TEMPLATES = (
    Template("fraud_detector", "binary", "files", "card_transactions", 10_000, 2, 1),
    Template("fraud_detector_sql", "binary", "sql", None, 5_000, 2, 2),
    Template("support_tickets", "multiclass text", "files", "support_tickets", 3_000, 1, 1),
    Template("fraud_detector_delta", "binary", "delta", None, 5_000, 2, 2),
    Template("search_ranking", "ranking", "files", "search_results", 3_000, 2, 1),
)


@dataclass
class Plan:
    pipeline: str
    template: Template
    fault: str | None = None  # rank_sigkill, mlflow_down, bad_day

    @property
    def expected(self) -> str:
        return "failed" if self.fault == "bad_day" else "success"


def fleet(count: int, seed: int) -> list[Plan]:
    """`count` pipelines in rotation over TEMPLATES, three of them given a fault drawn by `seed`."""
    plans = [
        Plan(f"many_{i:02d}_{TEMPLATES[i % len(TEMPLATES)].example}", TEMPLATES[i % len(TEMPLATES)])
        for i in range(count)
    ]
    rng = random.Random(seed)
    files = [p for p in plans if p.template.example == "fraud_detector"]
    rng.choice(files).fault = "bad_day"
    # A fraud job checkpoints at steps 20 and 40 of its ~55: the killed rank's retry has one to resume.
    long_enough = [p for p in plans if p.template.example.startswith("fraud") and p.fault is None]
    rng.choice(long_enough).fault = "rank_sigkill"
    rng.choice([p for p in plans if p.fault is None]).fault = "mlflow_down"
    return plans


def pipeline_config(plan: Plan) -> str:
    t = plan.template
    config = yaml.safe_load((EXAMPLE_CONFIGS / f"{t.example}.yaml").read_text())
    config["pipeline"] = plan.pipeline
    config["description"] = (
        f"The many-pipelines soak's {t.kind} pipeline on {t.source} (tests/helpers/soak_many.py)."
    )
    config.setdefault("register", {})["model_name"] = plan.pipeline
    config["schedule"].update(max_active_runs=1, retries=2, retry_delay="5s", catchup=False)
    config["schedule"].pop("deadline", None)
    config.pop("notify", None)
    if plan.fault == "bad_day":
        config["data"]["uri"] = BAD_DATA
    training = config["training"]
    training["hyperparameters"].update(epochs=t.epochs)
    if t.example.startswith("fraud"):
        training["hyperparameters"].update(batch_size=64)
    training["resources"] = {**training.get("resources", {}), "processes_per_node": t.ranks}
    training["checkpoint"] = {**training.get("checkpoint", {}), "every_steps": EVERY_STEPS}
    return yaml.safe_dump(config, sort_keys=False)


def write_data(home: Path, plans: list[Plan], up: Any) -> None:
    """The day of every file source, the SQL and Delta tables as `make up` fills them (their last
    7 days), and the bad day's copy with nulls in `amount`. (Drift compares with a pipeline's
    previously validated day: a pipeline's first run has none, so the bad day is not a drift.)"""
    from airflow_trainpipe.examples.synthetic import Problem, write_day

    for template in {p.template for p in plans}:
        root = home / "data" / (template.data_kind or "")
        if template.data_kind is not None and not (root / f"ds={DAY}" / "_SUCCESS").exists():
            write_day(root.as_uri(), DAY, template.rows, seed=DAY.day, kind=template.data_kind)
    bad = home / BAD_DATA
    write_day(bad.as_uri(), DAY, 10_000, seed=DAY.day, problems=[Problem.parse(BAD_DAY_PROBLEM)])
    if any(p.template.source == "sql" for p in plans):
        up.ensure_warehouse(home)
    if any(p.template.source == "delta" for p in plans):
        up.ensure_delta(home)


class Sampler(threading.Thread):
    """Twice a second: the training ranks of this stack running now, the host's memory in use."""

    def __init__(self, home: Path):
        super().__init__(daemon=True)
        self.home = str(home)
        self.most_ranks = 0
        self.at_most = ""  # when the most ranks ran, and which
        self.baseline_mib = self._used_mib()
        self.peak_mib = self.baseline_mib
        self._done = threading.Event()

    @staticmethod
    def _used_mib() -> float:
        memory = psutil.virtual_memory()
        return (memory.total - memory.available) / 2**20

    def ranks(self) -> list[psutil.Process]:
        """The ranks of this stack's jobs: the processes running the entrypoint, torchrun's
        children or orphans, but not what a rank forks itself (which inherits its command line)."""

        def rank_like(cmdline: list[str]) -> bool:
            return ENTRYPOINT in cmdline and not any("torch.distributed.run" in part for part in cmdline)

        found = []
        for process in psutil.process_iter(["cmdline"]):
            if not rank_like(process.info["cmdline"] or []):
                continue
            try:
                parent = process.parent()
                forked_by_a_rank = parent is not None and rank_like(parent.cmdline())
                if not forked_by_a_rank and process.environ().get("TRAINPIPE_HOME") == self.home:
                    found.append(process)
            except psutil.Error:
                continue
        return found

    def _describe(self, ranks: list[psutil.Process]) -> str:
        parts = []
        for rank in ranks:
            try:
                parts.append(f"pid {rank.pid} rank {rank.environ().get('RANK')} of torchrun {rank.ppid()}")
            except psutil.Error:
                parts.append(f"pid {rank.pid} (gone)")
        return "; ".join(parts)

    def run(self) -> None:
        while not self._done.wait(0.5):
            ranks = self.ranks()
            if len(ranks) > self.most_ranks:
                self.most_ranks = len(ranks)
                self.at_most = f"{time.strftime('%H:%M:%S')}: {self._describe(ranks)}"
            self.peak_mib = max(self.peak_mib, self._used_mib())

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=5)


@dataclass
class Outcome:
    pipeline: str
    kind: str
    source: str
    fault: str
    expected: str
    run_id: str = ""
    state: str = "?"
    tasks: dict[str, str] = field(default_factory=dict)
    retries: list[tuple[str, str]] = field(default_factory=list)  # (task, cause) of each failed try
    run_start: str | None = None
    run_end: str | None = None
    train_start: str | None = None
    train_end: str | None = None
    train_slots: int = 0
    train_tries: list[tuple[str, str]] = field(default_factory=list)  # each try's start and end: slots held
    run_s: float | None = None
    train_s: float | None = None
    struck: str = "-"
    problems: list[str] = field(default_factory=list)


class ManySoak:
    def __init__(self, stack: Any, plans: list[Plan], up: Any, say: Callable[[str], None] = print):
        self.stack, self.plans, self.up, self.say = stack, plans, up, say
        self.outcomes = {
            p.pipeline: Outcome(p.pipeline, p.template.kind, p.template.source, p.fault or "-", p.expected)
            for p in plans
        }
        self.pool_slots = 0
        self.drain_s = 0.0
        self.sampler = Sampler(stack.home)
        self.outage: tuple[datetime, datetime] | None = None  # when the MLflow server was down (UTC)

    # -- setup ------------------------------------------------------------------------------------

    def install(self) -> None:
        import subprocess
        import sys

        write_data(self.stack.home, self.plans, self.up)
        for plan in self.plans:
            (self.stack.configs / f"{plan.pipeline}.yaml").write_text(pipeline_config(plan))
        trainpipe = Path(sys.executable).parent / "trainpipe"
        applied = subprocess.run(
            [str(trainpipe), "pools", str(self.stack.configs), "--apply"],
            env=self.stack.airflow_env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert applied.returncode == 0, applied.stderr[-3000:]
        self.say(applied.stdout.strip())
        self.pool_slots = int(self.stack.get("/api/v2/pools/trainpipe_training")["slots"])
        for plan in self.plans:
            dag = self.stack.wait_for(
                f"DAG {plan.pipeline}",
                lambda p=plan.pipeline: (d := self.stack.dag(p)) and not d["is_stale"] and d,
                600,
            )
            assert "trainpipe:broken-config" not in [t["name"] for t in dag["tags"]], dag["description"]

    # -- the drain --------------------------------------------------------------------------------

    def run(self) -> list[Outcome]:
        self.install()
        self.sampler.start()
        started = time.monotonic()
        for plan in self.plans:  # unpaused and triggered back to back: well within a minute
            self.stack.session.patch(
                f"{self.stack.url}/api/v2/dags/{plan.pipeline}", json={"is_paused": False}, timeout=30
            ).raise_for_status()
            response = self.stack.session.post(
                f"{self.stack.url}/api/v2/dags/{plan.pipeline}/dagRuns",
                json={"dag_run_id": f"many_{DAY}", "logical_date": f"{DAY}T02:00:00Z"},
                timeout=30,
            )
            response.raise_for_status()
            self.outcomes[plan.pipeline].run_id = response.json()["dag_run_id"]
        self.say(f"triggered {len(self.plans)} runs in {time.monotonic() - started:.1f}s")
        strikers = [
            threading.Thread(target=self._strike, args=(plan,), daemon=True)
            for plan in self.plans
            if plan.fault in ("rank_sigkill", "mlflow_down")
        ]
        for striker in strikers:
            striker.start()
        self._drain(started)
        self.drain_s = time.monotonic() - started
        self.sampler.stop()
        for striker in strikers:
            striker.join(timeout=30)
        for plan in self.plans:
            self._collect(plan)
        return list(self.outcomes.values())

    def _drain(self, started: float) -> None:
        pending = {p.pipeline for p in self.plans}
        while pending and time.monotonic() - started < RUN_TIMEOUT_S:
            for pipeline in sorted(pending):
                outcome = self.outcomes[pipeline]
                state = self.stack.get(f"/api/v2/dags/{pipeline}/dagRuns/{outcome.run_id}")["state"]
                if state in ("success", "failed"):
                    outcome.state = state
                    pending.discard(pipeline)
                    self.say(
                        f"  {time.monotonic() - started:6.0f}s {pipeline}: {state} ({len(pending)} left)"
                    )
            time.sleep(2)
        for pipeline in pending:
            self.outcomes[pipeline].state = "stuck"

    def _strike(self, plan: Plan) -> None:
        """Once the plan's job trains (and, for a killed rank, has a complete checkpoint to resume)."""
        from airflow_trainpipe.contracts.train_spec import run_dir_name
        from tests.helpers.mlflow_server import restart_mlflow_server

        outcome = self.outcomes[plan.pipeline]
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while time.monotonic() < deadline and outcome.state == "?":
            job = find_job(outcome.run_id, self.stack.home) if outcome.run_id else None
            if job is not None and job.ranks:
                folder = self.stack.home / "checkpoints" / plan.pipeline / run_dir_name(outcome.run_id)
                if plan.fault == "mlflow_down":
                    down = datetime.now(UTC)
                    restart_mlflow_server(self.stack.mlflow, down_s=5.0)
                    self.outage = (down, datetime.now(UTC))
                    outcome.struck = f"mlflow server down for {(self.outage[1] - down).total_seconds():.1f}s"
                    self.say(f"  {plan.pipeline}: {outcome.struck}")
                    return
                if list(folder.glob("checkpoints/step_*/COMPLETE.json")):
                    rank = job.ranks[max(job.ranks)]
                    rank.kill()
                    outcome.struck = f"SIGKILL rank {max(job.ranks)} (pid {rank.pid})"
                    self.say(f"  {plan.pipeline}: {outcome.struck}")
                    return
            time.sleep(0.2)
        outcome.struck = "MISSED: the job ended before the fault could strike"

    # -- afterwards -------------------------------------------------------------------------------

    def _collect(self, plan: Plan) -> None:
        outcome, stack = self.outcomes[plan.pipeline], self.stack
        runs = f"/api/v2/dags/{plan.pipeline}/dagRuns/{outcome.run_id}"
        dag_run = stack.get(runs)
        outcome.run_start, outcome.run_end = dag_run.get("start_date"), dag_run.get("end_date")
        outcome.run_s = seconds_between(outcome.run_start, outcome.run_end)
        for ti in stack.get(f"{runs}/taskInstances")["task_instances"]:
            outcome.tasks[ti["task_id"]] = ti["state"]
            if ti["try_number"] and ti["try_number"] > 1:
                tries = stack.get(f"{runs}/taskInstances/{ti['task_id']}/tries")["task_instances"]
                for attempt in tries[:-1] if ti["state"] == "success" else tries:
                    if attempt["state"] in ("failed", "up_for_retry"):
                        outcome.retries.append((ti["task_id"], self._cause(plan, ti["task_id"], attempt)))
            if ti["task_id"] == "train" and ti["start_date"]:
                tries = stack.get(f"{runs}/taskInstances/train/tries")["task_instances"]
                # An upstream_failed train (the bad day) has dates too, but never ran: no slot held.
                outcome.train_tries = [
                    (t["start_date"], t["end_date"])
                    for t in tries
                    if t["state"] in ("success", "failed", "up_for_retry")
                    and t.get("start_date")
                    and t.get("end_date")
                ]
                starts = [t["start_date"] for t in tries if t.get("start_date")]
                outcome.train_start, outcome.train_end = min(starts), ti["end_date"]
                outcome.train_s = seconds_between(outcome.train_start, outcome.train_end)
                outcome.train_slots = ti["pool_slots"]
        self._check(plan, outcome)

    def _cause(self, plan: Plan, task_id: str, attempt: dict[str, Any]) -> str:
        """The seeded fault a failed try is explained by, or `not seeded`."""
        if plan.fault == "rank_sigkill" and task_id == "train":
            return "rank_sigkill"
        ended = attempt.get("end_date")
        if self.outage is not None and ended is not None:
            down, back = self.outage
            if down <= datetime.fromisoformat(ended) <= back + timedelta(seconds=60):
                return "mlflow_down"
        return "not seeded"

    def _check(self, plan: Plan, outcome: Outcome) -> None:
        if outcome.state != plan.expected:
            outcome.problems.append(f"ended {outcome.state}, expected {plan.expected}")
        stopped = outcome.tasks.get("validate_data") == "failed" and outcome.tasks.get("train") != "success"
        if plan.fault == "bad_day" and not stopped:
            outcome.problems.append(f"the bad day was not stopped at validation: {outcome.tasks}")
        if plan.fault == "bad_day" and self._versions(plan.pipeline):
            outcome.problems.append("the bad day registered a model version")
        if outcome.state == "success":
            self._check_trained(plan, outcome)

    def _versions(self, pipeline: str) -> list[Any]:
        from mlflow import MlflowClient

        return list(MlflowClient(self.stack.mlflow.url).search_model_versions(f"name = '{pipeline}'"))

    def _check_trained(self, plan: Plan, outcome: Outcome) -> None:
        from airflow_trainpipe.config import load_config
        from airflow_trainpipe.contracts.tags import GATE_PROMOTE_TAG
        from airflow_trainpipe.contracts.train_spec import run_dir_name
        from airflow_trainpipe.data.snapshots.manifests import load_manifest
        from airflow_trainpipe.data.snapshots.store import copy_hashed

        runs = f"/api/v2/dags/{plan.pipeline}/dagRuns/{outcome.run_id}"
        validation = self.stack.get(f"{runs}/taskInstances/validate_data/xcomEntries/return_value")["value"]
        config = load_config(self.stack.configs / f"{plan.pipeline}.yaml")
        manifest = load_manifest(config.data, validation["manifest"]["digest"])  # hashes to its digest
        with open(os.devnull, "wb") as nowhere:
            for entry in manifest.files:
                if copy_hashed(entry.uri, nowhere) != entry.sha256.removeprefix("sha256:"):
                    outcome.problems.append(f"snapshot file {entry.uri} no longer hashes to its sha256")
        checkpoints = self.stack.home / "checkpoints" / plan.pipeline
        foreign = [p.name for p in checkpoints.iterdir() if p.name != run_dir_name(outcome.run_id)]
        if foreign:
            outcome.problems.append(f"checkpoints of other runs under {checkpoints}: {foreign}")
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        client = MlflowClient(self.stack.mlflow.url)  # the credentials: soak.py exports client_env()
        try:
            version = client.get_model_version_by_alias(plan.pipeline, "champion")
        except MlflowException:
            return  # no champion: the gate promoted nothing (below its floor), nothing to check
        run = client.get_run(version.run_id)
        if run.data.tags.get(GATE_PROMOTE_TAG) != "true":  # the gate's decision is on the candidate's run
            outcome.problems.append(
                f"@champion v{version.version}'s run has {GATE_PROMOTE_TAG}={run.data.tags.get(GATE_PROMOTE_TAG)}"
            )
        if {version.tags.get("airflow.dag_id"), run.data.tags.get("airflow.dag_id")} != {plan.pipeline}:
            outcome.problems.append(
                f"@champion v{version.version} comes from {version.tags.get('airflow.dag_id')}'s MLflow run "
                f"{version.run_id} of {run.data.tags.get('airflow.dag_id')}"
            )


# -- the report ----------------------------------------------------------------------------------


def held_at_once(intervals: list[tuple[datetime, datetime, int]]) -> int:
    """The most slots held at one instant by (start, end, slots) intervals: a sweep over their
    edges, an end before a start at the same instant (a slot given back is free to take)."""
    edges = [(start, slots) for start, _, slots in intervals] + [(end, -slots) for _, end, slots in intervals]
    held = most = 0
    for _, change in sorted(edges):
        held += change
        most = max(most, held)
    return most


def slots_at_once(outcomes: list[Outcome]) -> int:
    """The most pool slots the train tasks held at one instant, from their tries' start and end."""
    return held_at_once(
        [
            (datetime.fromisoformat(start), datetime.fromisoformat(end), o.train_slots)
            for o in outcomes
            for start, end in o.train_tries  # a retry's delay holds no slot
        ]
    )


def ideal_drain_s(outcomes: list[Outcome], pool_slots: int) -> float:
    """A lower bound of the drain with these runs' own task times: the training pool is the
    bottleneck, so the slot-seconds the train tries held, packed without a gap, after the shortest
    lead-in (a run's time before train) and before the shortest tail (after train). (Not the
    longest run: a run's time includes its wait for the pool.)"""
    trained = [o for o in outcomes if o.train_tries and o.run_s is not None]
    if not trained:
        return 0.0

    def gap(start: str | None, end: str | None) -> float:
        return max(0.0, seconds_between(start, end) or 0.0)

    held = sum(gap(start, end) * o.train_slots for o in trained for start, end in o.train_tries)
    packed = held / pool_slots
    lead = min(gap(o.run_start, o.train_start) for o in trained)
    tail = min(gap(o.train_end, o.run_end) for o in trained)
    return lead + packed + tail


def retries_by_cause(outcomes: list[Outcome]) -> Counter[str]:
    return Counter(f"{task} ({cause})" for o in outcomes for task, cause in o.retries)


@dataclass
class Report:
    lines: list[str]
    ok: bool


def report(soak: ManySoak) -> Report:
    outcomes = list(soak.outcomes.values())
    header = f"{'pipeline':<36} {'kind':<16} {'source':<6} {'fault':<13} {'state':<8} {'retries':<18} {'train_s':>7} {'run_s':>6}  struck"
    lines = [header, "-" * len(header)]
    for o in outcomes:
        retries = ",".join(f"{t}x{n}" for t, n in Counter(task for task, _ in o.retries).items()) or "-"
        lines.append(
            f"{o.pipeline:<36} {o.kind:<16} {o.source:<6} {o.fault:<13} {o.state:<8} {retries:<18} "
            f"{o.train_s or 0:>7.0f} {o.run_s or 0:>6.0f}  {o.struck}"
        )
    as_said = [o for o in outcomes if not o.problems]
    lost = [o for o in outcomes if o.state not in ("success", "failed")]
    held = slots_at_once(outcomes)
    ideal = ideal_drain_s(outcomes, soak.pool_slots)
    own = sum(o.run_s or 0 for o in outcomes)
    lines += [
        "",
        f"pipelines that ended as their data and faults say: {len(as_said)}/{len(outcomes)}; lost or stuck: {len(lost)}",
        f"training pool: {soak.pool_slots} slots; most slots held at once by train tasks: {held}; "
        f"most training ranks running at once (sampled every 0.5 s): {soak.sampler.most_ranks} "
        f"(at {soak.sampler.at_most})",
        f"drain: {soak.drain_s:.0f}s from the first trigger to the last run's end; the runs' own times "
        f"add up to {own:.0f}s ({own / soak.drain_s if soak.drain_s else 0:.1f}x the drain); ideal packing "
        f"of the training pool {ideal:.0f}s: drain / ideal = {soak.drain_s / ideal if ideal else 0:.2f}",
        f"host memory in use: {soak.sampler.baseline_mib:.0f} MiB before the triggers, peak {soak.sampler.peak_mib:.0f} MiB",
        "task retries by cause: "
        + (", ".join(f"{k}: {v}" for k, v in sorted(retries_by_cause(outcomes).items())) or "none"),
    ]
    for o in outcomes:
        lines += [f"PROBLEM {o.pipeline}: {problem}" for problem in o.problems]
    ok = (
        len(as_said) == len(outcomes)
        and not lost
        and held <= soak.pool_slots
        and soak.sampler.most_ranks <= soak.pool_slots
    )
    return Report(lines, ok)
